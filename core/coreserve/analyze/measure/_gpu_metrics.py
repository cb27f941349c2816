"""The GPUs' memory and utilisation while a load runs, read from the server's metrics.

coreserve and Triton both export NVML's readings as Prometheus families (`nv_gpu_utilization`,
`nv_gpu_memory_used_bytes`, one sample per GPU labelled `gpu_uuid`), refreshed every
`--metrics-interval-ms`. Model Analyzer reads the same families from Triton's metrics URL, so
this works for a server the analysis starts and for one it only measures (`--server-url`).
A server whose metrics have no GPU samples (no GPU, or NVML not installed) has no GPU columns.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass

import aiohttp

UTILIZATION = "nv_gpu_utilization"  # 0.0 to 1.0
MEMORY_USED = "nv_gpu_memory_used_bytes"
POLL_S = 0.5  # how often the endpoint is read while open (the server started refreshes as often)
READ_TIMEOUT_S = 5.0
_SAMPLE = re.compile(r'^(\w+)\{[^}]*gpu_uuid="([^"]*)"[^}]*\}\s+(\S+)')


@dataclass(frozen=True)
class GpuSample:
    """One reading of every GPU: utilisation (0 to 1) and memory used (bytes), by UUID."""

    at: float  # time.monotonic()
    utilization: dict[str, float]
    memory_used: dict[str, float]


@dataclass(frozen=True)
class GpuFigures:
    """What a load level used: utilisation averaged over its time and the GPUs, and the most
    memory the GPUs held together at any reading."""

    utilization_percent: float
    memory_used_mb: float


def gpu_sample(text: str, at: float) -> GpuSample | None:
    """The GPU samples of a Prometheus text exposition; None where it has none."""
    found: dict[str, dict[str, float]] = {UTILIZATION: {}, MEMORY_USED: {}}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match[1] not in found:
            continue
        try:
            found[match[1]][match[2]] = float(match[3])
        except ValueError:
            continue
    if not found[UTILIZATION] and not found[MEMORY_USED]:
        return None
    return GpuSample(at, found[UTILIZATION], found[MEMORY_USED])


def gpu_figures(samples: list[GpuSample], since: float, until: float) -> GpuFigures | None:
    """The figures of the samples read between `since` and `until`; where none was read then,
    the last one read before `until`."""
    chosen = [sample for sample in samples if since <= sample.at <= until]
    if not chosen:
        chosen = [sample for sample in samples if sample.at <= until][-1:]
    if not chosen:
        return None
    utilizations = [sum(s.utilization.values()) / len(s.utilization) for s in chosen if s.utilization]
    utilization = 100 * sum(utilizations) / len(utilizations) if utilizations else 0.0
    memory = max(sum(sample.memory_used.values()) for sample in chosen)
    return GpuFigures(utilization, memory / 1e6)


class GpuMetrics:
    """The server's metrics endpoint, read every POLL_S from `open` until `close`."""

    def __init__(self, url: str, session: aiohttp.ClientSession, first: GpuSample) -> None:
        self.url = url
        self._session = session
        self.samples = [first]
        self.gpus = sorted(first.utilization.keys() | first.memory_used.keys())  # their UUIDs
        self._poller = asyncio.create_task(self._poll())

    @classmethod
    async def open(cls, url: str) -> tuple[GpuMetrics | None, str]:
        """The endpoint's GPUs being read, or None and why there are no GPU figures."""
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=READ_TIMEOUT_S))
        try:
            first = await _read(session, url)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            await session.close()
            return None, f"the metrics at {url} could not be read ({type(exc).__name__}: {exc})"
        if first is None:
            await session.close()
            return None, f"the metrics at {url} report no GPU"
        return cls(url, session, first), f"{len(first.utilization or first.memory_used)} GPU(s)"

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            # A reading that fails leaves a gap; the figures come from the others.
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                sample = await _read(self._session, self.url)
                if sample is not None:
                    self.samples.append(sample)

    def figures(self, since: float, until: float) -> GpuFigures | None:
        return gpu_figures(self.samples, since, until)

    async def close(self) -> None:
        self._poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._poller
        await self._session.close()


async def _read(session: aiohttp.ClientSession, url: str) -> GpuSample | None:
    async with session.get(url) as response:
        if response.status != 200:
            raise ValueError(f"HTTP {response.status}")
        return gpu_sample(await response.text(), time.monotonic())
