"""coreserve's own gRPC server: HTTP/2 on an asyncio Protocol, for `--grpc-server native`.

grpc.aio spends most of a small call in its own per-call machinery (issue 16); this server does
only what gRPC needs of HTTP/2 (wire.py: frames; headers.py: HPACK decoding with a cache of
repeated blocks; connection.py: frames in and out under flow control; calls.py: one call and
its handler) and serves the grpc.aio frontend's own servicers (frontend.py).
"""

from __future__ import annotations

from coreserve.server.grpc_native.frontend import NativeGrpcFrontend

__all__ = ["NativeGrpcFrontend"]
