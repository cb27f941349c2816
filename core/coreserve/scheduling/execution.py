"""Running one batch on one instance, with the guarantees the core gives every backend."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from coreserve.backend.api import ModelInstance
from coreserve.backend.responder import Responder
from coreserve.config.signature import ModelSignature
from coreserve.errors import CoreserveError, InternalError
from coreserve.scheduling.statistics import ModelStatistics
from coreserve.types import InferenceRequest, now_ns

logger = logging.getLogger(__name__)


async def execute_batch(
    instance: ModelInstance,
    batch: Sequence[InferenceRequest],
    signature: ModelSignature,
    statistics: ModelStatistics,
    *,
    decoupled: bool = False,
) -> Responder:
    """Executes a batch; whatever the backend does, every request of it ends answered.

    An exception from the backend fails the requests it left open; a non-decoupled backend
    that returns without answering a request fails that request with an internal error.
    The execution is recorded in `statistics`.
    """
    model_version = statistics.version
    responder = Responder(signature, model_version, batch)
    try:
        await instance.execute(batch, responder)
    except CoreserveError as exc:
        responder.fail_open_requests(exc)
    except Exception as exc:
        logger.exception("model '%s' version %s failed while executing", signature.model_name, model_version)
        responder.fail_open_requests(
            InternalError(f"model '{signature.model_name}' failed: {type(exc).__name__}: {exc}")
        )
    else:
        if not decoupled:
            responder.fail_open_requests(
                InternalError(f"model '{signature.model_name}' returned without answering the request")
            )
    statistics.record_execution(batch, responder, now_ns())
    return responder
