"""The server's side of the Python backend: the backend, its instances and their stub processes.

`PythonBackend` (`_backend`) creates a `PythonInstance` (`_instance`) per instance; each runs
its model in a stub process (`_process` talks to it, `_spawn` starts and reaps it, `_environment`
picks its Python) and answers the model's requests: BLS calls (`_bls`), metrics and model
management (`_model_requests`). Its modules are private; the plugin's entry point
(`coreserve_python.plugin`) takes `PythonBackend` from here.

What this package may import: coreserve's public API (`coreserve`, `coreserve.backend`),
`coreserve_python.ipc` and `coreserve_python.pb_utils` (the error codes), never
`coreserve_python.stub`, which runs in the stub's process.
"""

from __future__ import annotations

from coreserve_python.server._backend import PythonBackend

__all__ = ["PythonBackend"]
