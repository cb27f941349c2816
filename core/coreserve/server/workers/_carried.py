"""What the workers' earlier lives counted: the supervisor keeps each worker's last figures,
and when a worker dies, what it had counted is carried into the server's totals (merged with
`carried=`), so that the server's counters do not fall back while the worker starts again.

Figures reach the supervisor with every gather a client asks for (metrics, the statistics of
every model or of one), and every REFRESH_S seconds besides: no figure a client has read goes
back when the worker that counted it dies, and what a worker counted after the last of them
(at most REFRESH_S seconds' worth, or since it hung) is lost with it, as a process that dies
loses it. A model loaded or unloaded starts its counts anew: its carried figures are forgotten.
"""

from __future__ import annotations

from typing import Any

from coreserve.server.workers._merge import (
    merge_metrics,
    merge_statistics,
    with_model_statistics,
    without_model_metrics,
    without_model_statistics,
)

REFRESH_S = 1.0
ALL_STATISTICS = {"call": "statistics", "name": "", "version": ""}
METRICS = {"call": "metrics"}


class CarriedFigures:
    """Each worker's last figures, and what the workers' earlier lives counted (merged into
    one metrics text and one statistics answer)."""

    def __init__(self) -> None:
        self._last: dict[int, dict[str, Any]] = {}  # by worker: its last metrics and statistics
        self.metrics: list[str] = []  # none, or one text
        self.statistics: list[dict[str, Any]] = []  # none, or one answer

    def seen(self, index: int, what: dict[str, Any], result: Any) -> None:
        """Notes a worker's answer to a gather: its metrics, or its statistics of every model,
        or of one model (which take that model's place in the last of every model)."""
        last = self._last.setdefault(index, {})
        if what == METRICS and isinstance(result, str):
            last["metrics"] = result
        elif what == ALL_STATISTICS and isinstance(result, dict):
            last["statistics"] = result
        elif what.get("call") == "statistics" and isinstance(result, dict):
            earlier = last.get("statistics", {"model_stats": []})
            last["statistics"] = with_model_statistics(earlier, result, what["name"], what["version"])

    def died(self, index: int) -> None:
        """Carries what a worker that left had counted, as last seen."""
        last = self._last.pop(index, {})
        if "metrics" in last:  # one text of every earlier life (its gauges are never carried)
            self.metrics = [merge_metrics([*self.metrics, last["metrics"]])]
        if "statistics" in last:
            self.statistics = [merge_statistics([*self.statistics, last["statistics"]])]

    def forget_model(self, name: str) -> None:
        """A model loaded or unloaded through the repository API: its counts start anew."""
        self.metrics = [without_model_metrics(text, name) for text in self.metrics]
        self.statistics = [without_model_statistics(answer, name) for answer in self.statistics]
        for last in self._last.values():
            if "metrics" in last:
                last["metrics"] = without_model_metrics(last["metrics"], name)
            if "statistics" in last:
                last["statistics"] = without_model_statistics(last["statistics"], name)

    def for_gather(self, what: dict[str, Any]) -> list[Any]:
        """The carried figures a gather of `what` adds up with the workers' answers."""
        if what == METRICS:
            return list(self.metrics)
        if what.get("call") == "statistics":
            return list(self.statistics)
        return []
