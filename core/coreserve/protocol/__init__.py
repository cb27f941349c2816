"""Pure functions between wire formats and requests/responses; no I/O happens here.

Layer 1: may import coreserve's errors, types, config and generated protos only.
"""
