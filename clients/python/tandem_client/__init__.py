"""Python client of the tandem router's gRPC API (tandem.v1.Router).

    from tandem_client import Client

    with Client("127.0.0.1:8100") as client:
        for chunk in client.generate("Once upon a time", max_tokens=64, timeout=30):
            print(chunk.text, end="", flush=True)
"""

from .client import ROUTER_SERVICE, Client, Stream
from .errors import (Cancelled, DeadlineExceeded, InvalidArgument, NotFound, PermissionDenied,
                     ResourceExhausted, TandemError, Unauthenticated, Unavailable)
from .types import (ChatMessage, Chunk, Completion, Constraint, Echo, Finished, FinishReason,
                    HealthStatus, NamedTool, Timeline, TokenLogprob, Tool, ToolCall, TopLogprob,
                    Usage)

__version__ = "0.1.0"

__all__ = [
    "ROUTER_SERVICE",
    "Cancelled",
    "ChatMessage",
    "Chunk",
    "Client",
    "Completion",
    "Constraint",
    "DeadlineExceeded",
    "Echo",
    "FinishReason",
    "Finished",
    "HealthStatus",
    "InvalidArgument",
    "NamedTool",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Stream",
    "TandemError",
    "Timeline",
    "TokenLogprob",
    "Tool",
    "ToolCall",
    "TopLogprob",
    "Unauthenticated",
    "Unavailable",
    "Usage",
]
