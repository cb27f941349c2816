"""The server's answers to a model's requests: custom metrics and model management.

A `PythonInstance` owns one `ModelRequestAnswers`, and hands it the model's requests.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from coreserve import CoreserveError, InvalidArgumentError, NotFoundError, UnavailableError
from coreserve.backend import CustomMetric, CustomMetricFamily, MetricKind, ServerContext
from coreserve_python.ipc import Message, ReplyMessage

logger = logging.getLogger("coreserve.backend.python")

# The model's requests the server answers with a `reply` (matched by the stub's call id).
ANSWERED_OPS = frozenset(
    {"metric_family", "metric", "metric_value", "load_model", "unload_model", "model_ready"}
)
# The model's metric messages that need no answer: updates, and the metrics and families it let go.
METRIC_TOLD_OPS = frozenset({"metric_update", "metric_delete", "metric_family_delete"})


class ModelRequestAnswers:
    """Answers one instance's metric and model-management requests, and keeps the metrics it made."""

    def __init__(self, name: str, server: ServerContext, send: Callable[[Mapping[str, Any]], None]) -> None:
        """`name`: the instance's, for the log; `send`: sends a message to the instance's stub."""
        self._name = name
        self._server = server
        self._send = send
        # Whether the model's initialize() runs as it loads (not as its stub restarts): a model
        # change it asks for then is made as the model loads (ModelControl's while_loading).
        self.loading = False
        # The custom metric families and metrics the model made, by the ids the stub knows them by.
        self._families: dict[int, CustomMetricFamily] = {}
        self._metrics: dict[int, CustomMetric] = {}
        self._metric_ids = 0

    async def answer(self, message: Message) -> None:
        """Answers a request of the model (metrics, model management) with a `reply`."""
        result: Any = None
        error = None
        try:
            result = await self._handle_request(message)
        except CoreserveError as exc:
            error = exc.message
        except Exception as exc:  # a fault of the server: logged once, and the model still answered
            logger.exception("%s: the server failed a '%s' request of the model", self._name, message["op"])
            error = f"internal error of the server: {type(exc).__name__}: {exc}"
        reply: ReplyMessage = {"op": "reply", "call": message["call"], "result": result, "error": error}
        self._send(reply)

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
            await models.load_model(message["name"], message["parameters"], while_loading=self.loading)
            return None
        # unload_model: a model that is not loaded is unloaded already, as Triton answers
        with contextlib.suppress(NotFoundError):
            await models.unload_model(message["name"], message["dependents"], while_loading=self.loading)
        return None

    def _remember_metric(self, table: dict[int, Any], item: Any) -> int:
        self._metric_ids += 1
        table[self._metric_ids] = item
        return self._metric_ids

    def metric_told(self, message: Message) -> None:
        """Applies an increment, set or observe the model sent (checked by the stub already), or
        drops a metric or family the model let go (it leaves the endpoint with its last owner)."""
        op = message["op"]
        if op == "metric_family_delete":
            if (family := self._families.pop(message["family"], None)) is not None:
                self._server.metrics.release(family)
            return
        if op == "metric_delete":
            if (deleted := self._metrics.pop(message["metric"], None)) is not None:
                deleted.family.release_metric(deleted)
            return
        metric = self._metrics.get(message["metric"])
        if metric is None:
            return
        try:
            getattr(metric, message["action"])(message["value"])
        except CoreserveError as exc:  # the stub checks first; a mismatch is ours to report
            logger.warning("%s: a metric update was refused: %s", self._name, exc.message)

    def release_metrics(self) -> None:
        """Gives back the model's custom metrics when its stub ends (unload, exit, a failed
        initialize()). They stay on the metrics endpoint with their values, as Triton keeps them,
        and a load (or a restarted stub) that makes them again continues them; only a family or
        metric the model itself deleted has left."""
        for metric in self._metrics.values():
            metric.family.release_metric(metric, keep=True)
        for family in self._families.values():
            self._server.metrics.release(family, keep=True)
        self._metrics.clear()
        self._families.clear()
