"""coreserve's own gRPC server: HTTP/2 on an asyncio Protocol, for `--grpc-server native`.

grpc.aio spends most of a small call in its own per-call machinery; this server does
only what gRPC needs of HTTP/2 (`_frames`: frames as bytes; `_hpack_decoder` and `_headers`:
HPACK decoding within a size limit, with a cache of repeated blocks; `_frame_reader` and
`_frame_layout`: the frames a client sends, checked; `_connection`: frames in and out under
flow control; `_streams`: the calls by stream; `_limits`: what one connection may ask of the
server; `_calls`: one call and its handler; `_compression`: compressed messages) and serves
the gRPC package's own servicers (`_frontend`). May import its parent package's servicers and
the server's runtime modules.
"""

from __future__ import annotations

from coreserve.server.grpc.native._frontend import NativeGrpcFrontend

__all__ = ["NativeGrpcFrontend"]
