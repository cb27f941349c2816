"""How many times the frontends have read bytes from a client (ServerActivity.frontend_reads).

A backend that waits for a worker process without sleeping, where its execution is all the
server has to do, watches it: if it moved while an execution ran, another client sent
something meanwhile, and the server is not serving one request at a time. The HTTP server and
the native gRPC server count; grpc.aio's (`--grpc-server grpcio`) reads in its own threads and
does not.
"""

from __future__ import annotations


class ReadCount:
    """A counter the connections add to on the event loop, read by the data plane."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


FRONTEND_READS = ReadCount()
