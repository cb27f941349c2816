"""The version of the installed `core-server` distribution, for the server's metadata and `--version`.

Layer 0: it imports nothing of coreserve, so that any layer may name the version.
"""

from __future__ import annotations

import importlib.metadata

try:
    __version__ = importlib.metadata.version("core-server")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = ["__version__"]
