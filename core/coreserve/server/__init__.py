"""The running server: the data plane, its frontends, and the `ServerRuntime` that owns them."""

from __future__ import annotations

from coreserve.server.app import ServerRuntime, StartupError
from coreserve.server.options import ServerOptions

__all__ = ["ServerOptions", "ServerRuntime", "StartupError"]
