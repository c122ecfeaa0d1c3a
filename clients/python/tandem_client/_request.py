"""Builds a tandem.v1.GenerateRequest from Client.generate's arguments.

Only what the proto cannot carry, or a value of the wrong type, is refused
here (ValueError); the ranges are the router's to check (INVALID_ARGUMENT
with a message saying what to change), so that they are checked once.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Optional, Sequence, Union

from ._proto import generate_pb2 as pb
from .types import ChatMessage, Constraint, NamedTool, Tool, ToolCall

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT64 = (0, 2**64 - 1)

ToolChoice = Union[str, NamedTool]
_TOOL_CHOICES = {
    "auto": pb.TOOL_CHOICE_AUTO,
    "none": pb.TOOL_CHOICE_NONE,
    "required": pb.TOOL_CHOICE_REQUIRED,
}


def check_int(name: str, value: Any, bounds: tuple[int, int] = INT32) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, not {type(value).__name__}")
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{name} is {value}; the API carries {bounds[0]} to {bounds[1]}")
    return value


def check_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} is {value}; it must be finite")
    return float(value)


def check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, not {type(value).__name__}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _sequence(name: str, value: Any) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a sequence (a list or tuple), not {type(value).__name__}")
    return value


def _json_text(name: str, value: Union[str, Mapping[str, Any]]) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return json.dumps(value)
    raise ValueError(f"{name} must be JSON text or a mapping, not {type(value).__name__}")


def _tool_call(name: str, call: Any, out: Any) -> None:
    if not isinstance(call, ToolCall):
        raise ValueError(f"{name} must be a ToolCall, not {type(call).__name__}")
    out.id = check_str(f"{name}.id", call.id)
    out.name = check_str(f"{name}.name", call.name)
    out.arguments = check_str(f"{name}.arguments", call.arguments)


def _messages(messages: Any, tools: Any, tool_choice: ToolChoice, single_tool_call: bool,
              out: Any) -> None:
    for i, m in enumerate(_sequence("messages", messages)):
        if not isinstance(m, ChatMessage):
            raise ValueError(f"messages[{i}] must be a ChatMessage, not {type(m).__name__}")
        p = out.messages.add()
        p.role = check_str(f"messages[{i}].role", m.role)
        p.content = check_str(f"messages[{i}].content", m.content)
        p.name = check_str(f"messages[{i}].name", m.name)
        for j, call in enumerate(_sequence(f"messages[{i}].tool_calls", m.tool_calls)):
            _tool_call(f"messages[{i}].tool_calls[{j}]", call, p.tool_calls.add())
        p.tool_call_id = check_str(f"messages[{i}].tool_call_id", m.tool_call_id)
    for i, t in enumerate(_sequence("tools", tools or ())):
        if not isinstance(t, Tool):
            raise ValueError(f"tools[{i}] must be a Tool, not {type(t).__name__}")
        p = out.tools.add()
        p.name = check_str(f"tools[{i}].name", t.name)
        p.description = check_str(f"tools[{i}].description", t.description)
        if t.parameters is not None:
            p.parameters = _json_text(f"tools[{i}].parameters", t.parameters)
    if isinstance(tool_choice, NamedTool):
        out.tool_choice = pb.TOOL_CHOICE_NAMED
        out.tool_choice_name = check_str("tool_choice.name", tool_choice.name)
    elif isinstance(tool_choice, str) and tool_choice in _TOOL_CHOICES:
        out.tool_choice = _TOOL_CHOICES[tool_choice]
    else:
        raise ValueError(
            f"tool_choice is {tool_choice!r}; use 'auto', 'none', 'required' or NamedTool(name)")
    out.single_tool_call = check_bool("single_tool_call", single_tool_call)


def _constraint(c: Any, out: Any) -> None:
    if not isinstance(c, Constraint):
        raise ValueError(f"constraint must be a Constraint, not {type(c).__name__}")
    kinds = [k for k, set_ in (("json_object", c.json_object), ("json_schema", c.json_schema is not None),
                               ("regex", c.regex is not None)) if set_]
    if len(kinds) != 1:
        raise ValueError("a Constraint takes exactly one of json_object, json_schema and regex"
                         + (f" (it has {', '.join(kinds)})" if kinds else ""))
    if c.json_object:
        out.json_object = check_bool("constraint.json_object", c.json_object)
    elif c.json_schema is not None:
        out.json_schema = _json_text("constraint.json_schema", c.json_schema)
    else:
        out.regex = check_str("constraint.regex", c.regex)
    out.prefix = check_str("constraint.prefix", c.prefix)
    out.suffix = check_str("constraint.suffix", c.suffix)
    for i, t in enumerate(_sequence("constraint.forced_token_ids", c.forced_token_ids)):
        out.forced_token_ids.append(check_int(f"constraint.forced_token_ids[{i}]", t))


def build_request(
    *,
    prompt: Optional[str],
    token_ids: Optional[Sequence[int]],
    messages: Optional[Sequence[ChatMessage]],
    tools: Optional[Sequence[Tool]],
    tool_choice: ToolChoice,
    single_tool_call: bool,
    max_tokens: Optional[int],
    temperature: float,
    top_k: int,
    top_p: Optional[float],
    min_p: float,
    seed: Optional[int],
    presence_penalty: float,
    frequency_penalty: float,
    repetition_penalty: Optional[float],
    logit_bias: Optional[Mapping[int, float]],
    min_tokens: int,
    constraint: Optional[Constraint],
    stop: Union[str, Sequence[str], None],
    n: int,
    logprobs: Optional[int],
    echo: bool,
    ignore_eos: bool,
    priority: int,
    server_timeout: Optional[float],
    model: str,
    request_id: str,
) -> Any:
    """The GenerateRequest message; ValueError for what it cannot carry."""
    r = pb.GenerateRequest()
    given = [k for k, v in (("prompt", prompt), ("token_ids", token_ids), ("messages", messages))
             if v is not None]
    if len(given) != 1:
        raise ValueError("give exactly one of prompt (text), token_ids and messages"
                         + (f"; got {' and '.join(given)}" if given else ""))
    if messages is None and (tools or tool_choice != "auto" or single_tool_call):
        raise ValueError("tools, tool_choice and single_tool_call go with messages (a chat)")
    if prompt is not None:
        r.text = check_str("prompt", prompt)
    elif token_ids is not None:
        ids = r.token_ids
        for i, t in enumerate(_sequence("token_ids", token_ids)):
            ids.ids.append(check_int(f"token_ids[{i}]", t))
        r.token_ids.SetInParent()  # [] is a prompt too: the router starts from BOS
    else:
        _messages(messages, tools, tool_choice, single_tool_call, r.messages)
        r.messages.SetInParent()

    s = r.sampling
    s.temperature = check_float("temperature", temperature)
    s.top_k = check_int("top_k", top_k)
    if top_p is not None:
        s.top_p = check_float("top_p", top_p)
    s.min_p = check_float("min_p", min_p)
    if seed is not None:
        s.seed = check_int("seed", seed, UINT64)
    s.presence_penalty = check_float("presence_penalty", presence_penalty)
    s.frequency_penalty = check_float("frequency_penalty", frequency_penalty)
    if repetition_penalty is not None:
        s.repetition_penalty = check_float("repetition_penalty", repetition_penalty)
    if logit_bias is not None:
        if not isinstance(logit_bias, Mapping):
            raise ValueError(f"logit_bias must be a mapping of token id to bias, "
                             f"not {type(logit_bias).__name__}")
        for token, bias in logit_bias.items():
            s.logit_bias[check_int("a logit_bias token id", token)] = check_float(
                f"logit_bias[{token}]", bias)
    s.min_tokens = check_int("min_tokens", min_tokens)
    if constraint is not None:
        _constraint(constraint, s.constraint)

    if max_tokens is not None:
        r.max_tokens = check_int("max_tokens", max_tokens)
    if stop is not None:
        for i, text in enumerate([stop] if isinstance(stop, str) else _sequence("stop", stop)):
            r.stop.append(check_str(f"stop[{i}]", text))
    r.n = check_int("n", n)
    if logprobs is not None:
        r.logprobs = check_int("logprobs", logprobs)
    r.echo = check_bool("echo", echo)
    r.ignore_eos = check_bool("ignore_eos", ignore_eos)
    r.priority = check_int("priority", priority)
    if server_timeout is not None:
        seconds = check_float("server_timeout", server_timeout)
        if seconds <= 0:
            raise ValueError(f"server_timeout is {server_timeout}; it must be > 0 seconds "
                             "(None = the router's default)")
        # At least 1 ms: 0 would mean the router's default.
        r.timeout_ms = check_int("server_timeout in ms", max(1, round(seconds * 1000)), INT64)
    r.model = check_str("model", model)
    r.request_id = check_str("request_id", request_id)
    return r
