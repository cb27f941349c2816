"""The stub: the process that runs one instance of a Python model (`python -m coreserve_python.stub`).

`_stub` runs the model's `initialize`, `execute` and `finalize` as the server asks; `_inbox`
takes the server's messages (on the main thread while idle, a standby thread while the model
runs); `_requests` sends the model's requests to the server (BLS, metrics, model management),
and `_forked` those of the processes the model forks.
Its modules are private: the server starts a stub by its command line, never imports it.

What this package may import: the standard library, numpy, `coreserve_python.ipc` and
`coreserve_python.pb_utils` (whose runtime the stub installs itself as), never coreserve nor
`coreserve_python.server`: a stub may run in another Python environment.
This module imports nothing, so that `python -m coreserve_python.stub` loads only the stub.
"""
