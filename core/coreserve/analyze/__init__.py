"""`coreserve analyze`: Model Analyzer's job. It sweeps a model's configuration and the client
load against a real server, keeps what meets the user's constraints, and writes a report.

A client of the server, in layer 2: it starts a `coreserve` process (or measures one already
running) and talks to it over HTTP and gRPC only, so it imports nothing of the server; it may
import `coreserve.config`, `coreserve.protocol`, `coreserve.protos`, `coreserve.types` and the
errors.
"""

from __future__ import annotations

from coreserve.analyze._command import main

__all__ = ["main"]
