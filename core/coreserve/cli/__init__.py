"""The `coreserve` command: its flags and their values, Triton's flag table, `new-backend`.

The top of the layers: it may import anything of coreserve. `main` is the command's entry
point (`coreserve.cli:main`); `coreserve ray` reads the same serving flags.
"""

from __future__ import annotations

from coreserve.cli._command import main
from coreserve.cli._flags import parse_serve_args
from coreserve.cli._options import server_options

__all__ = ["main", "parse_serve_args", "server_options"]
