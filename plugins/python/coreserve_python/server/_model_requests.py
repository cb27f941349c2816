"""The server's answers to a model's requests: custom metrics and model management.

`ModelRequestAnswers` is the part of `coreserve_python.instance.PythonInstance` that gives them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from coreserve import CoreserveError, InvalidArgumentError, NotFoundError, UnavailableError
from coreserve.backend import CustomMetric, CustomMetricFamily, MetricKind, ServerContext
from coreserve_python.ipc import Message, ReplyMessage

logger = logging.getLogger("coreserve.backend.python")

# The model's requests the server answers with a `reply` (matched by the stub's call id).
ANSWERED_OPS = frozenset(
    {"metric_family", "metric", "metric_value", "load_model", "unload_model", "model_ready"}
)


class ModelRequestAnswers:
    """Answers the model's metric and model-management requests; a part of `PythonInstance`."""

    # Set by the instance (see `PythonInstance.__init__`).
    name: str
    _server: ServerContext
    _families: dict[int, CustomMetricFamily]
    _metrics: dict[int, CustomMetric]
    _metric_ids: int

    if TYPE_CHECKING:

        def _process_send(self, message: Mapping[str, Any]) -> None: ...

    async def _answer(self, message: Message) -> None:
        """Answers a request of the model (metrics, model management) with a `reply`."""
        result: Any = None
        error = None
        try:
            result = await self._handle_request(message)
        except CoreserveError as exc:
            error = exc.message
        except Exception as exc:  # a fault of the server: logged once, and the model still answered
            logger.exception("%s: the server failed a '%s' request of the model", self.name, message["op"])
            error = f"internal error of the server: {type(exc).__name__}: {exc}"
        reply: ReplyMessage = {"op": "reply", "call": message["call"], "result": result, "error": error}
        self._process_send(reply)

    async def _handle_request(self, message: Message) -> Any:
        op = message["op"]
        if op == "metric_family":
            family = self._server.metrics.family(
                message["name"], message["description"], MetricKind(message["kind"])
            )
            return self._remember_metric(self._families, family)
        if op == "metric":
            family = self._families[message["family"]]
            metric = family.metric(message["labels"], message["buckets"] or None)
            return self._remember_metric(self._metrics, metric)
        if op == "metric_value":
            return self._metrics[message["metric"]].value()
        models = self._server.models
        if models is None:
            raise UnavailableError("this server offers no model repository API to backends")
        if op == "model_ready":
            version = message["version"]
            if version and not version.isdigit():  # refused before the name is looked up, as Triton
                raise InvalidArgumentError(
                    f"failed to get model version from specified version string '{version}' (details: "
                    "stol), version should be an integral value > 0"
                )
            return models.model_ready(message["name"], version)
        if op == "load_model":
            await models.load_model(message["name"], message["parameters"])
            return None
        # unload_model: a model that is not loaded is unloaded already, as Triton answers
        with contextlib.suppress(NotFoundError):
            await models.unload_model(message["name"], message["dependents"])
        return None

    def _remember_metric(self, table: dict[int, Any], item: Any) -> int:
        self._metric_ids += 1
        table[self._metric_ids] = item
        return self._metric_ids

    def _update_metric(self, message: Message) -> None:
        """Applies an increment, set or observe the model sent (checked by the stub already)."""
        metric = self._metrics.get(message["metric"])
        if metric is None:
            return
        try:
            getattr(metric, message["action"])(message["value"])
        except CoreserveError as exc:  # the stub checks first; a mismatch is ours to report
            logger.warning("%s: a metric update was refused: %s", self.name, exc.message)

    def _release_metrics(self) -> None:
        """Takes the model's custom metrics off the metrics endpoint (unload, stub exit)."""
        for metric in self._metrics.values():
            metric.family.release_metric(metric)
        for family in self._families.values():
            self._server.metrics.release(family)
        self._metrics.clear()
        self._families.clear()
