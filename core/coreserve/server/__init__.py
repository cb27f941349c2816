"""The running server: the data plane, its frontends, and the `Server` that owns them."""

from __future__ import annotations

from coreserve.server.app import Server, StartupError
from coreserve.server.options import ServerOptions

__all__ = ["Server", "ServerOptions", "StartupError"]
