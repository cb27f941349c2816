"""The running server: the data plane, its frontends, and the `ServerRuntime` that owns them.

Layer 5 for the runtime's own modules (data plane, restrictions, log settings), 6 for the
frontends in its packages, 7 for `app` and `options`: each may import the layers below it
(docs/architecture.md draws them).
"""

from __future__ import annotations

from coreserve.server.app import ServerRuntime, StartupError
from coreserve.server.options import ServerOptions

__all__ = ["ServerOptions", "ServerRuntime", "StartupError"]
