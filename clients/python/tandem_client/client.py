"""Client of tandem.v1.Router: streaming Generate and the router's health."""

from __future__ import annotations

import threading
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import grpc

from . import _request
from ._proto import generate_pb2_grpc
from .errors import from_rpc_error
from .types import (ChatMessage, Chunk, Completion, Constraint, HealthStatus, Tool,
                    chunk_from_proto)

Metadata = Sequence[tuple[str, str]]

# The router reports the pool's health under its service's name: NOT_SERVING
# while no decode worker is routable. "" is the process as a whole.
ROUTER_SERVICE = "tandem.v1.Router"
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def _check_timeout(name: str, timeout: Optional[float]) -> Optional[float]:
    if timeout is None:
        return None
    seconds = _request.check_float(name, timeout)
    if seconds <= 0:
        raise ValueError(f"{name} is {timeout}; it must be > 0 seconds (None = no deadline)")
    return seconds


class Stream(Iterator[Chunk]):
    """The chunks of one Generate call, as they arrive.

    Iterating raises a TandemError subclass when the call fails
    (DeadlineExceeded once the timeout passes). cancel() (or close(), or
    leaving a `with` block) cancels the call: the router stops the request on
    every worker and frees its KV, and the iteration ends (StopIteration)
    without an error. cancel() may be called from any thread.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self._lock = threading.Lock()
        self._cancelled = False
        self._done = False

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> Chunk:
        if self._done or self._cancelled:
            raise StopIteration
        try:
            message = next(self._call)
        except StopIteration:
            self._done = True
            raise
        except grpc.RpcError as e:
            self._done = True
            with self._lock:
                if self._cancelled:
                    raise StopIteration from None
            raise from_rpc_error(e) from None
        return chunk_from_proto(message)

    def cancel(self) -> bool:
        """Cancels the call; True when it was still running (False once it had ended)."""
        with self._lock:
            if self._cancelled:
                return False
            self._cancelled = True
        return bool(self._call.cancel())

    def close(self) -> None:
        """Same as cancel(), for use as a closing resource."""
        self.cancel()

    @property
    def cancelled(self) -> bool:
        """Whether cancel() was called."""
        return self._cancelled

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def collect(self) -> list[Completion]:
        """Reads the rest of the stream; one Completion per choice, by index."""
        by_index: dict[int, Completion] = {}
        for chunk in self:
            c = by_index.setdefault(chunk.index, Completion(index=chunk.index))
            c.token_ids.extend(chunk.token_ids)
            c.text += chunk.text
            c.logprobs.extend(chunk.logprobs)
            if chunk.echo is not None:
                c.echo = chunk.echo
            if chunk.finished is not None:
                c.finished = chunk.finished
        return [by_index[i] for i in sorted(by_index)]


def _encode_health_request(service: str) -> bytes:
    # grpc.health.v1.HealthCheckRequest { string service = 1; }: field 1,
    # length-delimited; "" is the empty message.
    data = service.encode()
    if not data:
        return b""
    out, n = bytearray(b"\x0a"), len(data)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + data


def _decode_health_response(data: bytes) -> HealthStatus:
    # grpc.health.v1.HealthCheckResponse { ServingStatus status = 1; }
    def varint(i: int) -> tuple[int, int]:
        value, shift = 0, 0
        while True:
            if i >= len(data) or shift > 63:
                raise ValueError("a malformed health response")
            b = data[i]
            value |= (b & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if not b & 0x80:
                return value, i

    status, i = 0, 0
    while i < len(data):
        key, i = varint(i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(i)
            if field == 1:
                status = value
        elif wire == 1:
            i += 8
        elif wire == 2:
            length, i = varint(i)
            i += length
        elif wire == 5:
            i += 4
        else:
            raise ValueError("a malformed health response")
    return HealthStatus(status)


class Client:
    """A connection to a tandem router.

    target is "host:port". Plain gRPC unless tls=True (the system's roots),
    root_certificates (PEM bytes of the CA the router's certificate chains
    to; implies TLS), private_key and certificate_chain (a client
    certificate for a router started with --tls_client_ca), or credentials
    (grpc.ChannelCredentials of your own). api_key is sent with every call
    as "authorization: Bearer KEY" metadata, as a router started with
    --api_key requires. options are grpc channel options.
    """

    def __init__(
        self,
        target: str,
        *,
        api_key: Optional[str] = None,
        tls: bool = False,
        root_certificates: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        _request.check_str("target", target)
        _request.check_bool("tls", tls)
        pem = {"root_certificates": root_certificates, "private_key": private_key,
               "certificate_chain": certificate_chain}
        for name, value in pem.items():
            if value is not None and not isinstance(value, bytes):
                raise ValueError(f"{name} must be PEM bytes, not {type(value).__name__}")
        if (private_key is None) != (certificate_chain is None):
            raise ValueError("private_key and certificate_chain go together")
        wants_tls = tls or any(v is not None for v in pem.values())
        if credentials is not None and wants_tls:
            raise ValueError("give credentials, or tls/root_certificates/private_key/"
                             "certificate_chain, not both")
        if credentials is None and wants_tls:
            credentials = grpc.ssl_channel_credentials(root_certificates, private_key,
                                                       certificate_chain)
        self._metadata: list[tuple[str, str]] = []
        if api_key is not None:
            if not _request.check_str("api_key", api_key):
                raise ValueError("api_key is empty; pass None for a router without keys")
            self._metadata.append(("authorization", f"Bearer {api_key}"))
        if credentials is not None:
            self._channel = grpc.secure_channel(target, credentials, options=list(options))
        else:
            self._channel = grpc.insecure_channel(target, options=list(options))
        self._stub = generate_pb2_grpc.RouterStub(self._channel)
        self._health = self._channel.unary_unary(
            _HEALTH_CHECK,
            request_serializer=_encode_health_request,
            response_deserializer=_decode_health_response,
        )

    def close(self) -> None:
        """Closes the channel; calls under way are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call_metadata(self, metadata: Optional[Metadata]) -> list[tuple[str, str]]:
        extra = list(metadata or ())
        for key, value in extra:
            _request.check_str("a metadata key", key)
            _request.check_str(f"metadata {key!r}", value)
            if key.lower() == "authorization" and self._metadata:
                raise ValueError("authorization metadata given twice (api_key and metadata)")
        return self._metadata + extra

    def health(self, service: str = ROUTER_SERVICE, *, timeout: Optional[float] = 10.0,
               wait_for_ready: bool = False) -> HealthStatus:
        """grpc.health.v1 Check of `service` (the router's pool by default; "" =
        the server). An unknown service raises NotFound. wait_for_ready waits
        (within the timeout) for the router to be reachable instead of
        failing with Unavailable at once."""
        seconds = _check_timeout("timeout", timeout)
        try:
            status: HealthStatus = self._health(
                _request.check_str("service", service), timeout=seconds,
                metadata=self._call_metadata(None),
                wait_for_ready=_request.check_bool("wait_for_ready", wait_for_ready))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return status

    def generate(
        self,
        prompt: Optional[str] = None,
        *,
        token_ids: Optional[Sequence[int]] = None,
        messages: Optional[Sequence[ChatMessage]] = None,
        max_tokens: Optional[int] = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: Optional[float] = None,
        min_p: float = 0.0,
        seed: Optional[int] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: Optional[float] = None,
        logit_bias: Optional[Mapping[int, float]] = None,
        min_tokens: int = 0,
        constraint: Optional[Constraint] = None,
        stop: Union[str, Sequence[str], None] = None,
        n: int = 1,
        logprobs: Optional[int] = None,
        echo: bool = False,
        ignore_eos: bool = False,
        tools: Optional[Sequence[Tool]] = None,
        tool_choice: _request.ToolChoice = "auto",
        single_tool_call: bool = False,
        priority: int = 0,
        model: str = "",
        request_id: str = "",
        timeout: Optional[float] = None,
        server_timeout: Optional[float] = None,
        metadata: Optional[Metadata] = None,
        wait_for_ready: bool = False,
    ) -> Stream:
        """Starts a Generate call and returns its Stream of chunks.

        The prompt is one of `prompt` (text, tokenized by the router, BOS
        first), `token_ids` (used as given) or `messages` (a chat, rendered by
        the served model's template; tools go with it). max_tokens=None lets a
        choice run to the end of the model's context. temperature 0 is greedy.
        timeout (seconds) is the gRPC deadline: past it the call ends with
        DeadlineExceeded; server_timeout is the router's own limit on the
        request (timeout_ms). Every other argument is the GenerateRequest
        field of the same name (proto/tandem/v1/generate.proto).
        """
        request = _request.build_request(
            prompt=prompt, token_ids=token_ids, messages=messages, tools=tools,
            tool_choice=tool_choice, single_tool_call=single_tool_call, max_tokens=max_tokens,
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            repetition_penalty=repetition_penalty, logit_bias=logit_bias, min_tokens=min_tokens,
            constraint=constraint, stop=stop, n=n, logprobs=logprobs, echo=echo,
            ignore_eos=ignore_eos, priority=priority, server_timeout=server_timeout, model=model,
            request_id=request_id)
        seconds = _check_timeout("timeout", timeout)
        call = self._stub.Generate(
            request, timeout=seconds, metadata=self._call_metadata(metadata),
            wait_for_ready=_request.check_bool("wait_for_ready", wait_for_ready))
        return Stream(call)
