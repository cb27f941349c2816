"""Verbose log lines about inference requests: what `--log-verbose` levels 1 and 2 add.

Level 1 follows each request's lifecycle (received, answered or failed); level 2 adds its
detail (inputs with datatypes and shapes, parameters, requested outputs). At level 0 the data
plane calls none of these, so a production server pays one comparison per request.
"""

from __future__ import annotations

import logging

from coreserve.types import InferenceRequest

logger = logging.getLogger("coreserve.requests")
DETAIL_LEVEL = 2


def _name(request: InferenceRequest, version: int) -> str:
    label = f"request '{request.id}'" if request.id else "request"
    return f"{label} for model '{request.model_name}' version {version}"


def received(request: InferenceRequest, version: int, level: int) -> None:
    logger.debug("%s: received", _name(request, version))
    if level >= DETAIL_LEVEL:
        inputs = ", ".join(
            f"{name} {array.dtype} {list(array.shape)}" for name, array in request.inputs.items()
        )
        outputs = ", ".join(request.requested_outputs) if request.requested_outputs is not None else "all"
        logger.debug(
            "%s: inputs [%s], parameters %s, outputs %s",
            _name(request, version),
            inputs,
            sorted(request.parameters),
            outputs,
        )


def answered(request: InferenceRequest, version: int) -> None:
    logger.debug("%s: answered", _name(request, version))


def failed(request: InferenceRequest, version: int, reason: str) -> None:
    logger.debug("%s: failed: %s", _name(request, version), reason)
