"""Hypothesis profiles for the fuzz suite, and the one server its wire-level tests share.

The suite runs in CI on every push, so its default profile ("ci") is small and
derandomized: the same 150 generated inputs per test each time, no example database, about
20 s on 2 cores. Longer, random runs are for a person who asks for them:

    COREFUZZ_PROFILE=long .venv/bin/python -m pytest -p no:cacheprovider tests/fuzz

The "long" profile keeps its example database in
`.hypothesis/` (ignored by git), so a failure it finds is replayed first on the next run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from coreserve.testing import ServerProcess
from support.paths import EXAMPLES

# The server tests are slow per example (a socket round trip on a shared machine): the fixture
# is module-scoped on purpose, and generation may take a while while the server is busy.
_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=_SLOW_IS_FINE,
)
settings.register_profile("long", max_examples=5_000, deadline=None, suppress_health_check=_SLOW_IS_FINE)
settings.load_profile(os.environ.get("COREFUZZ_PROFILE", "ci"))


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[ServerProcess]:
    """coreserve over examples/model_repository; the tests check its log for tracebacks at the end."""
    server = ServerProcess([EXAMPLES]).start(timeout=120)
    yield server
    server.close()
