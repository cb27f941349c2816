"""coreserve's own gRPC server: HTTP/2 on an asyncio Protocol, for `--grpc-server native`.

grpc.aio spends most of a small call in its own per-call machinery (issue 16); this server does
only what gRPC needs of HTTP/2 (wire.py: frames; hpack_decoder.py and headers.py: HPACK
decoding within a size limit, with a cache of repeated blocks; connection.py: frames in and out
under flow control; limits.py: what one connection may ask of the server; calls.py: one call
and its handler; compression.py: compressed messages) and serves the grpc.aio frontend's own
servicers (frontend.py).
"""

from __future__ import annotations

from coreserve.server.grpc_native.frontend import NativeGrpcFrontend

__all__ = ["NativeGrpcFrontend"]
