"""coreserve's Python backend: Triton `model.py` files, each instance in a stub process.

Its packages, from the bottom up:

- `ipc`: what crosses between the server and a stub (messages, framed channel, tensors in
  shared memory); standard library and numpy only.
- `pb_utils`: the API a model.py uses (`triton_python_backend_utils`, which `shim/` makes
  importable under Triton's name); standard library, numpy and `ipc`.
- `stub`: the process that runs a model (`python -m coreserve_python.stub`); imports `ipc` and
  `pb_utils`, never coreserve, so that a stub can run in another Python environment.
- `server`: the backend and its instances, which start stubs and talk to them; imports
  coreserve's public API, `ipc` and `pb_utils`.

`plugin` is the entry point (`coreserve.backends`) that registers the backend.
This module imports nothing, so that importing `coreserve_python.pb_utils` stays light.
"""
