"""The Ray cluster of the Ray Serve tests (see ray_cluster.py), shared by the whole folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.servers.ray_cluster import RayCluster, run_cluster


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[RayCluster]:
    """A head node and a second node, both on 127.0.0.1, for the whole package."""
    yield from run_cluster()
