"""Memory given back on unload (Triton #5841, #7020, #6781, #8969): tests/soak/unload.py, short.

A Python model and an ONNX model are loaded, checked and unloaded 20 times, and a corrupt ONNX
model and a broken model.py fail to load 20 times, each over a coreserve of its own in explicit
mode. After the last cycle the server must hold no more descriptors or threads than after the
first (give or take the event loop's default executor: see the soak), no stub process, and RSS
within RSS_GROWTH_MB of the first cycle's (the soak's bound is
50 MB over 100 cycles; 20 cycles measured +0.1 to +1 MB, see docs/development.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from soak.unload import CASES, build_repository, cycle_failed_loads, cycle_loads, explicit_server

CYCLES = 20
RSS_GROWTH_MB = 20.0


@pytest.mark.parametrize("backend", ["python", "onnxruntime"])
def test_load_infer_unload_cycles_give_everything_back(tmp_path: Path, backend: str) -> None:
    case = CASES[backend]
    repository, expected = build_repository(case, tmp_path)
    with explicit_server(repository) as server:
        loads = cycle_loads(server, backend, case.inputs, case.output, expected, CYCLES, 2, deadline=_never())
        failed = cycle_failed_loads(server, backend, CYCLES, deadline=_never())
        log = server.log
    assert loads.cycles == CYCLES and failed.cycles == CYCLES, (loads.errors, failed.errors, log[-3000:])
    assert loads.failures(RSS_GROWTH_MB) == [], (loads, log[-3000:])
    assert failed.failures(RSS_GROWTH_MB) == [], (failed, log[-3000:])
    assert loads.before.children == 0 and loads.last is not None and loads.last.children == 0


def _never() -> float:
    """A deadline the cycles do not reach (pytest's timeout bounds the test)."""
    return time.monotonic() + 600
