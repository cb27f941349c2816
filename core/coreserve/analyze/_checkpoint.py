"""Measurements kept as they are made, so an interrupted analysis resumes where it stopped.

One JSON line per measurement in `checkpoint.jsonl`; the first line names the model, so a
folder of another model's analysis is not mixed in.
"""

from __future__ import annotations

import json
from pathlib import Path

from coreserve.analyze._points import Measurement, ModelSettings

FILE_NAME = "checkpoint.jsonl"


class CheckpointMismatch(Exception):
    """The output folder holds another model's analysis."""


class Checkpoint:
    def __init__(self, out_dir: Path, model: str) -> None:
        self.path = out_dir / FILE_NAME
        self.points: dict[tuple[ModelSettings, int], Measurement] = {}
        if self.path.exists():
            self._read(model)
        else:
            self.path.write_text(json.dumps({"model": model}) + "\n")

    def _read(self, model: str) -> None:
        lines = self.path.read_text().splitlines()
        header = json.loads(lines[0]) if lines else {}
        if header.get("model") != model:
            raise CheckpointMismatch(
                f"{self.path} holds an analysis of model {header.get('model')!r}, not {model!r}: "
                "choose another --output-dir or remove that file"
            )
        for line in lines[1:]:
            try:
                point = Measurement.from_json(json.loads(line))
            except (ValueError, TypeError, KeyError):
                continue  # a line cut short when the run was interrupted
            self.points[(point.settings, point.concurrency)] = point

    def get(self, settings: ModelSettings, concurrency: int) -> Measurement | None:
        return self.points.get((settings, concurrency))

    def add(self, point: Measurement) -> None:
        self.points[(point.settings, point.concurrency)] = point
        with self.path.open("a") as file:
            file.write(json.dumps(point.to_json()) + "\n")

    def measurements(self) -> list[Measurement]:
        return list(self.points.values())
