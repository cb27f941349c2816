"""coreserve's Python backend: Triton `model.py` files, each instance in a stub process.

Two sides live here. The server side (`plugin`, `backend`, `process`, `instance`) imports
coreserve. The stub side (`wire`, `pb_utils` and its `pb_*` parts, `stub`) runs inside the
stub processes and imports only the standard library and numpy, so a stub can run in another
Python environment.
This module imports nothing, so that importing `coreserve_python.pb_utils` stays light.
"""
