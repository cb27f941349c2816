"""Named shared-memory regions under a lock: what the system and CUDA registries share."""

from __future__ import annotations

import threading
from typing import Any, Generic, Protocol, TypeVar

from coreserve.errors import NotFoundError


class Region(Protocol):
    def status(self) -> dict[str, Any]:
        """The region as Triton's status reports it."""
        ...


R = TypeVar("R", bound=Region)


class RegionTable(Generic[R]):
    """Regions by name; `kind` ("system", "cuda") names them in Triton's not-found text."""

    kind = ""

    def __init__(self) -> None:
        self._regions: dict[str, R] = {}
        self._lock = threading.Lock()

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._regions

    def count(self) -> int:
        return len(self._regions)

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """The registered regions (or one of them), as Triton's status reports them."""
        with self._lock:
            if not name:
                return [region.status() for region in self._regions.values()]
            region = self._regions.get(name)
            if region is None:
                raise NotFoundError(f"Unable to find {self.kind} shared memory region: '{name}'")
            return [region.status()]

    def _remove(self, name: str) -> list[R]:
        """Takes one region out, or every region when `name` is empty (unknown names: none)."""
        with self._lock:
            if name:
                return [self._regions.pop(name)] if name in self._regions else []
            removed = list(self._regions.values())
            self._regions.clear()
            return removed
