"""The in-process API: `coreserve.Server` and its `Model` handles (import them from `coreserve`).

The modules here are private; `coreserve/__init__.py` exports what is public.

Layer 8: may import anything of coreserve (it runs a whole server).
"""

from __future__ import annotations

from coreserve.inprocess._model import Model
from coreserve.inprocess._server import FRONTENDS, Server

__all__ = ["FRONTENDS", "Model", "Server"]
