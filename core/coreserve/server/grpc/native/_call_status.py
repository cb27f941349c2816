"""The gRPC status codes the native server answers with, and the exception that carries one."""

from __future__ import annotations

import grpc

OK = 0
CANCELLED = grpc.StatusCode.CANCELLED.value[0]
UNKNOWN = grpc.StatusCode.UNKNOWN.value[0]
DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED.value[0]
INTERNAL = grpc.StatusCode.INTERNAL.value[0]


class CallAborted(Exception):
    """Ends a call with a status: what `context.abort` raises, and the server's own refusals."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
