"""The typed values of the API: what a request takes and what a stream yields.

They mirror proto/tandem/v1/generate.proto (its comments are the reference
for every field); lists are tuples so that the values are immutable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

# ---- Request values --------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A function call: one the model made, or one an assistant message carries back."""

    id: str
    name: str
    # A JSON object's text.
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation (role "system", "user", "assistant" or "tool")."""

    role: str
    content: str = ""
    # The author's name, for templates that write it; "" = none.
    name: str = ""
    # An assistant message: the calls it made.
    tool_calls: Sequence[ToolCall] = ()
    # A tool message: the id of the call it answers.
    tool_call_id: str = ""


@dataclass(frozen=True)
class Tool:
    """A function the model may call; `parameters` is a JSON Schema (text or a mapping)."""

    name: str
    description: str = ""
    parameters: Union[str, Mapping[str, Any], None] = None


@dataclass(frozen=True)
class NamedTool:
    """tool_choice=NamedTool("f"): the output is one call of function f."""

    name: str


@dataclass(frozen=True)
class Constraint:
    """What the output must be: exactly one of json_object, json_schema or regex.

    json_schema is a JSON Schema's text or a mapping (sent as JSON); prefix
    and suffix are literal text around the constrained output, and
    forced_token_ids (at most 8) are forced before the prefix.
    """

    json_object: bool = False
    json_schema: Union[str, Mapping[str, Any], None] = None
    regex: Optional[str] = None
    prefix: str = ""
    suffix: str = ""
    forced_token_ids: Sequence[int] = ()


# ---- Response values -------------------------------------------------------


class FinishReason(enum.Enum):
    """Why a choice ended (FinishReason in the proto)."""

    UNSPECIFIED = 0
    # max_tokens generated.
    LENGTH = 1
    # The model produced its end-of-sequence token (not returned).
    EOS = 2
    # A stop string appeared (it and what follows are not returned).
    STOP = 3
    # The model's context is full.
    CONTEXT = 4
    # End of sequence after calls (Finished.tool_calls).
    TOOL_CALLS = 5

    @classmethod
    def _missing_(cls, value: object) -> "FinishReason":
        # A reason newer than this client.
        return cls.UNSPECIFIED


class HealthStatus(enum.Enum):
    """grpc.health.v1's serving status."""

    UNKNOWN = 0
    SERVING = 1
    NOT_SERVING = 2
    SERVICE_UNKNOWN = 3

    @classmethod
    def _missing_(cls, value: object) -> "HealthStatus":
        return cls.UNKNOWN


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    # Of this choice.
    completion_tokens: int = 0
    # Prompt tokens whose KV came from a prefix cache.
    cached_tokens: int = 0


@dataclass(frozen=True)
class Timeline:
    """Where the request's time went, in microseconds (0 = the phase did not happen)."""

    router_queue_us: int = 0
    prefill_queue_us: int = 0
    prefill_us: int = 0
    kv_transfer_us: int = 0
    decode_queue_us: int = 0
    first_token_us: int = 0
    end_us: int = 0
    reserve_us: int = 0
    prefill_call_us: int = 0


@dataclass(frozen=True)
class Finished:
    """The end of one choice: on its last chunk."""

    reason: FinishReason
    usage: Usage
    timeline: Timeline
    # Which workers served the request ("" for none), and whether the
    # prompt was prefilled on a prefill worker.
    prefill_worker: str = ""
    decode_worker: str = ""
    disaggregated: bool = False
    # With tools: the calls the output made (reason TOOL_CALLS).
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float
    # The token's text as bytes (a byte-level token may be part of a character).
    token: bytes = b""


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    token: bytes = b""
    # The most likely tokens at this position, most likely first.
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class Echo:
    """The prompt, when the request asked for echo."""

    token_ids: tuple[int, ...]
    text: str
    # With logprobs: one per prompt token after the first.
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Chunk:
    """One message of the stream: tokens of choice `index` since its previous chunk."""

    index: int
    token_ids: tuple[int, ...]
    # Their text (whole UTF-8 characters only; may be empty).
    text: str
    # With logprobs: one per token id.
    logprobs: tuple[TokenLogprob, ...] = ()
    # On the first chunk only, when the request asked for echo.
    echo: Optional[Echo] = None
    # Set on the last chunk of each choice.
    finished: Optional[Finished] = None


@dataclass
class Completion:
    """A whole choice, gathered from its chunks (Stream.collect())."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    echo: Optional[Echo] = None
    finished: Optional[Finished] = None


# ---- From the generated messages -------------------------------------------


def _logprobs(items: Any) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(
            token_id=l.token_id,
            logprob=l.logprob,
            token=bytes(l.token),
            top=tuple(TopLogprob(t.token_id, t.logprob, bytes(t.token)) for t in l.top),
        )
        for l in items
    )


def _finished(f: Any) -> Finished:
    u, t = f.usage, f.timeline
    return Finished(
        reason=FinishReason(f.reason),
        usage=Usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens),
        timeline=Timeline(
            router_queue_us=t.router_queue_us,
            prefill_queue_us=t.prefill_queue_us,
            prefill_us=t.prefill_us,
            kv_transfer_us=t.kv_transfer_us,
            decode_queue_us=t.decode_queue_us,
            first_token_us=t.first_token_us,
            end_us=t.end_us,
            reserve_us=t.reserve_us,
            prefill_call_us=t.prefill_call_us,
        ),
        prefill_worker=f.prefill_worker,
        decode_worker=f.decode_worker,
        disaggregated=f.disaggregated,
        tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in f.tool_calls),
    )


def chunk_from_proto(m: Any) -> Chunk:
    """A Chunk from a tandem.v1.GenerateResponse."""
    echo = None
    if m.HasField("echo"):
        echo = Echo(tuple(m.echo.token_ids), m.echo.text, _logprobs(m.echo.logprobs))
    return Chunk(
        index=m.index,
        token_ids=tuple(m.token_ids),
        text=m.text,
        logprobs=_logprobs(m.logprobs),
        echo=echo,
        finished=_finished(m.finished) if m.HasField("finished") else None,
    )
