"""The run's record: stages in a fixed order, each with its own time budget and its own error,
and a results file rewritten as soon as a stage has figures, so that a run cut short still
leaves what it measured."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.support.reporting import Table, machine, print_table

REPOSITORY = Path(__file__).resolve().parents[2]


class OutOfTime(Exception):
    """A stage's budget ran out: it stops, and keeps what it measured so far."""


@dataclass
class Stage:
    """One stage's figures as it goes: `figures` grows, `check()` stops it at its deadline."""

    name: str
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    figures: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    record: Record | None = None

    @property
    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def check(self, needs_s: float = 0.0) -> None:
        """Raises OutOfTime when less than `needs_s` of the budget is left."""
        if self.left_s < needs_s:
            raise OutOfTime(f"{self.name}: budget of {self.budget_s:g} s spent")

    def put(self, key: str, value: Any) -> None:
        """Records a figure and rewrites the results file at once."""
        self.figures[key] = value
        if self.record is not None:
            self.record.save()

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        self.tables.append(print_table(title, columns, rows))
        if self.record is not None:
            self.record.save()


class Record:
    """The results file of one run: the machine, the parameters and every stage's figures."""

    def __init__(self, path: Path, parameters: dict[str, Any], plan: dict[str, Any]) -> None:
        self.path = path
        self.parameters = parameters
        self.plan = plan
        self.machine = {**machine(), **accelerator(), "software": software()}
        self.stages: list[Stage] = []
        self.errors: dict[str, str] = {}
        self.started = time.monotonic()

    def run(self, name: str, budget_s: float, body: Callable[[Stage], None]) -> Stage:
        """Runs one stage; its failure (or its budget running out) is recorded, not raised."""
        stage = Stage(name, budget_s, record=self)
        self.stages.append(stage)
        print(f"\n== {name} (budget {budget_s:g} s)", flush=True)
        try:
            body(stage)
        except OutOfTime as exc:
            self.errors[name] = f"out of time: {exc}"
        except Exception as exc:  # a stage fails alone; the run goes on
            self.errors[name] = f"{type(exc).__name__}: {exc}"[-4000:]
            traceback.print_exc()
        stage.figures["seconds"] = round(time.monotonic() - stage.started, 1)
        if name in self.errors:
            print(f"!! {name}: {self.errors[name][:500]}", flush=True)
        self.save()
        return stage

    def save(self) -> None:
        document = {
            "script": "gpu",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": self.machine,
            "parameters": self.parameters,
            "tables": [table.__dict__ for stage in self.stages for table in stage.tables],
            "data": {
                "seconds": round(time.monotonic() - self.started, 1),
                "plan": self.plan,
                "stages": {stage.name: stage.figures for stage in self.stages},
                "errors": self.errors,
            },
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(document, indent=2, default=_plain))
        temporary.replace(self.path)


def _plain(value: Any) -> object:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _command(*args: str) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def accelerator() -> dict[str, Any]:
    """The GPU as nvidia-smi names it (name, driver, memory), or None where there is none."""
    said = _command("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
    if said is None:
        return {"gpu": None}
    name, driver, memory = (part.strip() for part in said.splitlines()[0].split(","))
    return {"gpu": name, "gpu_driver": driver, "gpu_memory": memory, "gpus": len(said.splitlines())}


def software() -> dict[str, Any]:
    """Versions the figures depend on, and the commit of the code that made them."""
    import coreserve

    versions: dict[str, Any] = {
        "python": platform.python_version(),
        "coreserve_file": coreserve.__file__,
        "coreserve_commit": git_commit(),
    }
    for name in ("torch", "torchvision", "transformers", "numpy", "grpc", "google.protobuf"):
        try:
            module = __import__(name, fromlist=["__version__"])
            versions[name] = getattr(module, "__version__", None)
        except ImportError:
            versions[name] = None
    if versions.get("torch"):
        import torch

        versions["torch_cuda"] = torch.version.cuda
        versions["cuda_available"] = torch.cuda.is_available()
    versions["argv"] = sys.argv
    return versions


def git_commit() -> str | None:
    """This tree's commit: git's answer, or the one the pack wrote ($GPU_BENCH_COMMIT) where
    the tree travelled without its .git."""
    return _command("git", "-C", str(REPOSITORY), "rev-parse", "--short", "HEAD") or os.environ.get(
        "GPU_BENCH_COMMIT"
    )
