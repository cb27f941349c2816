"""The KServe v2 REST frontend, with Triton's extensions, on the shared HTTP/1.1 server.

`_frontend` routes the v2 endpoints onto the data plane; `_control` answers the repository,
log and trace endpoints, `_shared_memory` the shared-memory extensions (`_json_bodies` reads
and writes their JSON); `_body_codec` turns bodies into requests and responses into bodies,
off the event loop where they are large (`_codec_threads`, and `_json_workers` for large
JSON). May import `coreserve.server.httpd`, the server's runtime modules, shared memory and the
protocol codecs; never the gRPC frontend.
"""

from __future__ import annotations

from coreserve.server.rest._body_codec import BodyCodec
from coreserve.server.rest._frontend import HTTP_STATUS, HttpFrontend

__all__ = ["HTTP_STATUS", "BodyCodec", "HttpFrontend"]
