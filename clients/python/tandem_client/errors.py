"""Errors of the router's API: one exception per gRPC status code it uses.

Every exception raised for a failed call is a TandemError carrying the gRPC
status code and the server's message (which says what to change for bad
input). Arguments the API cannot express are refused before any call, with
ValueError (or TypeError for unknown keyword arguments, as Python does).
"""

from __future__ import annotations

from typing import Optional

import grpc


class TandemError(Exception):
    """A call failed with a gRPC status other than OK."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidArgument(TandemError):
    """Bad input (INVALID_ARGUMENT); the message says what to change."""


class NotFound(TandemError):
    """An unknown model name, or an unknown health service (NOT_FOUND)."""


class Unauthenticated(TandemError):
    """A missing or invalid API key (UNAUTHENTICATED)."""


class PermissionDenied(TandemError):
    """PERMISSION_DENIED."""


class ResourceExhausted(TandemError):
    """The cluster is overloaded: the router's queue is full or the wait ran out."""


class Unavailable(TandemError):
    """No worker can serve, a worker was lost mid-stream, or the router is unreachable."""


class DeadlineExceeded(TandemError):
    """The call's deadline (the client's timeout or the router's limit) passed."""


class Cancelled(TandemError):
    """The call was cancelled by someone other than this client's cancel()."""


_BY_CODE: dict[grpc.StatusCode, type[TandemError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def error_for(code: grpc.StatusCode, message: str) -> TandemError:
    """The exception for a status: its own class, else TandemError itself."""
    return _BY_CODE.get(code, TandemError)(code, message)


def from_rpc_error(error: grpc.RpcError) -> TandemError:
    """Maps an error raised by grpcio (a grpc.Call for failed calls)."""
    code: Optional[grpc.StatusCode] = None
    message = str(error)
    if isinstance(error, grpc.Call):
        code = error.code()
        message = error.details() or ""
    return error_for(code if code is not None else grpc.StatusCode.UNKNOWN, message)
