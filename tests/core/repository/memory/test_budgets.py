"""The memory budget's values and the measurement of a process tree's resident memory."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from coreserve.repository.memory._budgeted import choose_victims
from coreserve.repository.memory.budgets import (
    MemoryBudgetError,
    MemoryBudgets,
    ModelMemory,
    Percent,
    parse_memory_budget,
    parse_memory_budgets,
    process_tree_rss,
)


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


def test_the_host_and_each_gpu_have_a_budget_of_their_own() -> None:
    assert parse_memory_budgets([], total=1000) == MemoryBudgets() and not MemoryBudgets()
    budgets = parse_memory_budgets(["40%", "gpu:0=8GB", "GPU:1 = 512MiB"], total=1000)
    assert budgets == MemoryBudgets(host=400, gpus={0: 8 * 10**9, 1: 512 * 2**20}) and budgets
    assert parse_memory_budgets(["gpu:3=1GB"]) == MemoryBudgets(gpus={3: 10**9})
    # A GPU's share is a share of what NVML reports for it, read when the budget is kept.
    budgets = parse_memory_budgets(["gpu:0=60%", "gpu:1=2.5 %"], total=1000)
    assert budgets.gpus == {0: Percent(60.0), 1: Percent(2.5)}
    assert Percent(60.0).of(143 * 10**9) == 85_800_000_000


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["1GB", "2GB"], "the host's model memory budget is given twice"),
        (["gpu:0=1GB", "gpu:0=2GB"], "the model memory budget of GPU 0 is given twice"),
        (["gpu:0"], "expected a GPU's model memory budget as gpu:<id>=BYTES or gpu:<id>=PERCENT"),
        (["gpu:x=1GB"], "expected a GPU's model memory budget as gpu:<id>=BYTES"),
        (["gpu:-1=1GB"], "expected a GPU's model memory budget as gpu:<id>=BYTES"),
        (["gpu:0=0"], "must be above 0 bytes, got 'gpu:0=0'"),
        (["gpu:0=0%"], "in percent must be above 0 and at most 100, got 'gpu:0=0%'"),
        (["gpu:0=140%"], "in percent must be above 0 and at most 100, got 'gpu:0=140%'"),
        (["gpu:0=40 percent"], "expected a model memory budget as BYTES (e.g. gpu:0=8GB) or PERCENT"),
    ],
)
def test_bad_gpu_budgets_are_refused(values: list[str], message: str) -> None:
    with pytest.raises(MemoryBudgetError, match=re.escape(message)):
        parse_memory_budgets(values, total=1000)


def test_a_gpus_refusal_names_the_gpu() -> None:
    memory = ModelMemory(budget=100 * 10**6, place="GPU 1")
    memory.record("a", 90 * 10**6)
    assert memory.refusal("b", None, "nothing can be unloaded").message == (
        "cannot load model 'b' (measured now) within GPU 1's model memory budget of 100.0 MB: "
        "loaded models use 90.0 MB, and nothing can be unloaded"
    )


def _places(
    host_budget: int | None, gpu_budget: int | None, loaded: dict[str, tuple[int, int]]
) -> dict[str, ModelMemory]:
    host, gpu = ModelMemory(host_budget), ModelMemory(gpu_budget, "GPU 0")
    for key, (on_host, on_gpu) in loaded.items():
        host.record(key, on_host)
        gpu.record(key, on_gpu)
    return {"host": host, "gpu:0": gpu}


def test_only_models_that_free_memory_where_room_is_wanted_are_unloaded() -> None:
    # LRU first: a CPU model (nothing on the GPU), then two GPU models; room is wanted on GPU 0.
    places = _places(None, 10, {"cpu_model": (50, 0), "gpu_a": (1, 4), "gpu_b": (1, 4)})
    victims, freeing, over = choose_victims(places, {"host": 1, "gpu:0": 5}, ["cpu_model", "gpu_a", "gpu_b"])
    assert (victims, over) == (["gpu_a"], None)
    assert freeing == {"host": 1, "gpu:0": 4}


def test_every_place_must_hold_the_model() -> None:
    # The host is over too: the CPU model goes for the host, a GPU model for the GPU.
    places = _places(60, 10, {"cpu_model": (50, 0), "gpu_a": (1, 4), "gpu_b": (1, 4)})
    victims, _, over = choose_victims(places, {"host": 20, "gpu:0": 5}, ["gpu_a", "cpu_model", "gpu_b"])
    assert (victims, over) == (["gpu_a", "cpu_model"], None)


def test_the_place_still_passed_is_named_when_nothing_more_can_go() -> None:
    places = _places(None, 10, {"gpu_a": (1, 4), "cpu_model": (50, 0)})
    victims, freeing, over = choose_victims(places, {"host": 1, "gpu:0": 12}, ["gpu_a", "cpu_model"])
    assert (victims, freeing["gpu:0"], over) == (["gpu_a"], 4, "gpu:0")
