"""The progress line: what was just measured, how far the sweep is, and an ETA where known."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from coreserve.analyze._points import Measurement


class Progress:
    def __init__(self, total_settings: int | None, stream: TextIO = sys.stderr) -> None:
        self.total = total_settings  # None for the quick search: its path is not known ahead
        self.expected_more: int | None = None  # the quick search's own estimate, as it goes
        self.stream = stream
        self.started = time.monotonic()
        self.settings_done = 0
        self.points = 0

    def settings_finished(self) -> None:
        self.settings_done += 1
        if self.expected_more:
            self.expected_more -= 1

    def expect(self, more: int) -> None:
        """The quick search's estimate of the settings it still measures."""
        self.expected_more = more

    def measured(self, point: Measurement, resumed: bool = False) -> None:
        self.points += 1
        what = (
            f"failed: {point.error.splitlines()[0][:80]}"
            if point.failed
            else f"concurrency {point.concurrency}: {point.throughput:.0f} infer/s, p99 {point.p99_ms:.1f} ms"
        )
        origin = " (from the checkpoint)" if resumed else ""
        self.stream.write(f"{self._bar()} {point.settings.key} {what}{origin}\n")
        self.stream.flush()

    def _bar(self) -> str:
        elapsed = time.monotonic() - self.started
        if not self.total:  # the quick search: its path is found as it goes, so the ETA is its estimate
            position = f"configuration {self.settings_done + 1}, {_clock(elapsed)}"
            if not self.expected_more or not self.settings_done:  # (0: the climb is near its end)
                return f"[{position}]"
            estimate = elapsed / self.settings_done * self.expected_more
            return f"[{position}, about {self.expected_more} more, ETA ~{_clock(estimate)}]"
        done = self.settings_done / self.total
        filled = int(20 * done)
        eta = elapsed / done * (1 - done) if done else None
        remaining = f", ETA {_clock(eta)}" if eta is not None else ""
        bar = "#" * filled + "." * (20 - filled)
        return f"[{bar}] {self.settings_done}/{self.total} {_clock(elapsed)}{remaining}"


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}:{seconds:02d}"
