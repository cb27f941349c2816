"""coreserve's own gRPC server: HTTP/2 on an asyncio Protocol, for `--grpc-server native`.

grpc.aio spends most of a small call in its own per-call machinery; this server does
only what gRPC needs of HTTP/2 (`frames`: frames as bytes, and the frames a client sends, read
and checked; `headers`: request header blocks decoded within a size limit, with a cache of
repeated blocks, and the blocks of the answers; `_connection`: frames in and out under flow
control; `_streams`: the calls by stream; `_sending`: answers under the client's windows;
`_limits`: what one connection may ask of the server; `_calls`: one call and its handler;
`_message_reader` and `_compression`: its messages) and serves the gRPC package's own
servicers (`_frontend`). May import its parent package's servicers and
the server's runtime modules.

Its sub-packages (`frames`, `headers`) sit below the connection: they import `limits` and each
other's modules, never the connection's. The modules they and this folder import of them are
named without an underscore; an underscore module is its own folder's.
"""

from __future__ import annotations

from coreserve.server.grpc.native._frontend import NativeGrpcFrontend

__all__ = ["NativeGrpcFrontend"]
