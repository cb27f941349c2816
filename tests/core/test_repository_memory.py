"""The memory budget's values and the measurement of a process tree's resident memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from coreserve.repository.memory import MemoryBudgetError, ModelMemory, parse_memory_budget, process_tree_rss


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GB", 2 * 10**9),
        ("512MB", 512 * 10**6),
        ("1GiB", 2**30),
        ("1.5 GiB", 3 * 2**29),
        ("4096", 4096),
        ("40%", 400),
        ("100%", 1000),
    ],
)
def test_budgets_are_read_in_bytes(text: str, expected: int) -> None:
    assert parse_memory_budget(text, total=1000) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "must be above 0 bytes"),
        ("0MB", "must be above 0 bytes"),
        ("abc", "expected a model memory budget as BYTES"),
        ("2XB", "expected a model memory budget as BYTES"),
        ("-1GB", "expected a model memory budget as BYTES"),
        ("150%", "at most 100"),
        ("0%", "above 0"),
    ],
)
def test_bad_budgets_are_refused(text: str, message: str) -> None:
    with pytest.raises(MemoryBudgetError, match=message):
        parse_memory_budget(text, total=1000)


def test_a_percentage_reads_the_hosts_memory() -> None:
    assert 0 < parse_memory_budget("50%") < parse_memory_budget("100%")


def test_a_child_process_counts_in_the_tree() -> None:
    alone = process_tree_rss()
    code = "import sys; block = bytearray(64 * 2**20); sys.stdout.write('x'); sys.stdout.flush(); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.read(1) == b"x"
        assert process_tree_rss() - alone >= 64 * 2**20
        assert process_tree_rss(child.pid) >= 64 * 2**20
    finally:
        child.communicate(b"", timeout=30)
    assert process_tree_rss(os.getpid()) > 0


def test_the_refusal_names_the_budget_the_usage_and_the_model() -> None:
    memory = ModelMemory(budget=100 * 10**6)
    memory.record("a", 80 * 10**6)
    assert memory.over(30 * 10**6) and not memory.over(20 * 10**6)
    assert memory.expected("b") is None
    error = memory.refusal("b", 30 * 10**6, "nothing can be unloaded")
    assert error.message == (
        "cannot load model 'b' (30.0 MB at its last load) within the model memory budget of 100.0 MB: "
        "loaded models use 80.0 MB, and nothing can be unloaded"
    )
    memory.release("a")
    assert memory.used() == 0 and memory.expected("a") == 80 * 10**6
