"""A version's instances, created at once where the backend allows it, are all closed when the
load fails or is cancelled, even if it is cancelled again meanwhile
(coreserve.repository._instances' `create_instances`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coreserve.backend.api import InstanceKind, InstancePlacement
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.repository._instances import create_instances


class _Instance:
    def __init__(self, name: str, backend: _Backend) -> None:
        self.name = name
        self._backend = backend

    async def execute(self, requests: Any, responder: Any) -> None:
        raise AssertionError("never executed")

    async def close(self) -> None:
        self._backend.closing.set()
        await self._backend.closes_may_end.wait()
        self._backend.closed.append(self.name)


class _Backend:
    """Creates instances at once; instance 1 fails; closes wait until the test lets them end."""

    name = "test"
    parallel_instance_loading = True

    def __init__(self) -> None:
        self.closing = asyncio.Event()
        self.closes_may_end = asyncio.Event()
        self.closed: list[str] = []

    async def create_instance(
        self, model: Any, config: Any, placement: InstancePlacement, server: Any
    ) -> _Instance:
        await asyncio.sleep(0)
        if placement.index == 1:
            raise RuntimeError("instance 1 fails")
        return _Instance(placement.name, self)


def test_a_load_cancelled_while_it_closes_after_a_failure_ends_cancelled_with_all_closed() -> None:
    async def scenario() -> None:
        backend = _Backend()
        placements = [InstancePlacement(f"m_0_{k}", "m_0", k, InstanceKind.CPU, 0) for k in range(3)]
        config = ModelConfig(name="m")
        load = asyncio.ensure_future(create_instances(backend, None, config, placements, None))  # type: ignore[arg-type]
        await asyncio.wait_for(backend.closing.wait(), 10)  # instance 1 failed: the others close
        load.cancel()
        await asyncio.sleep(0)
        backend.closes_may_end.set()
        with pytest.raises(asyncio.CancelledError):  # the cancellation is not lost to the failure
            await load
        assert sorted(backend.closed) == ["m_0_0", "m_0_2"]

    asyncio.run(asyncio.wait_for(scenario(), 60))
