"""Measurements kept as they are made, so an interrupted analysis resumes where it stopped.

One JSON line per measurement in `checkpoint.jsonl`. The first line says what was measured:
the model, the server (one the analysis started on a repository, or the one at --server-url)
and the load (protocol and generator); a folder whose measurements differ in any of these is
refused rather than mixed in. A file holding that line alone is taken over.
"""

from __future__ import annotations

import json
from pathlib import Path

from coreserve.analyze._points import Measurement, ModelSettings

FILE_NAME = "checkpoint.jsonl"


class CheckpointMismatch(Exception):
    """The output folder holds measurements of another model, server or load."""


class Checkpoint:
    def __init__(self, out_dir: Path, header: dict[str, str]) -> None:
        """`header`: what the measurements are of ("model", "server", "load")."""
        self.path = out_dir / FILE_NAME
        self.points: dict[tuple[ModelSettings, int], Measurement] = {}
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        if len(lines) > 1:
            self._read(lines, header)
        else:
            self.path.write_text(json.dumps(header) + "\n")

    def _read(self, lines: list[str], header: dict[str, str]) -> None:
        try:
            found = json.loads(lines[0])
        except ValueError:
            found = {}
        for key, value in header.items():
            if found.get(key) != value:
                raise CheckpointMismatch(
                    f"{self.path} holds measurements of {key} {found.get(key)!r}, not {value!r}: "
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
