"""`model_warmup`: sample requests a model version runs before it reports READY."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from coreserve.backend.api import ModelInstance
from coreserve.errors import CoreserveError, ModelConfigError
from coreserve.protos.model_config_pb2 import ModelWarmup
from coreserve.repository.model import ModelVersion
from coreserve.scheduling import ModelStatistics, execute_batch
from coreserve.types import NUMPY_DTYPES, DataType, InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"


def _sample(
    name: str, spec: ModelWarmup.Input, shape: tuple[int, ...], model_path: Path, model: str
) -> np.ndarray:
    if any(dimension < 0 for dimension in shape):  # Triton's words
        raise ModelConfigError(
            f"model '{model}': warmup setting expects all variable-size dimensions are specified "
            f"for input '{name}'"
        )
    datatype = DataType.from_config_value(spec.data_type)
    dtype = NUMPY_DTYPES[datatype]
    count = int(np.prod(shape)) if shape else 1
    choice = spec.WhichOneof("input_data_type")
    if choice == "input_data_file":
        path = model_path / WARMUP_FOLDER / spec.input_data_file
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelConfigError(
                f"model '{model}': warmup input '{name}' cannot read {path}: {exc}"
            ) from None
        if datatype is DataType.BYTES:
            return np.full(shape, data, dtype=np.object_)
        if len(data) != count * dtype.itemsize:
            raise ModelConfigError(
                f"model '{model}': warmup input '{name}': {path} holds {len(data)} bytes, "
                f"but {count} {datatype} elements need {count * dtype.itemsize}"
            )
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    if datatype is DataType.BYTES:
        value = b"warmup" if choice == "random_data" else b""
        return np.full(shape, value, dtype=np.object_)
    if choice == "random_data":
        rng = np.random.default_rng()
        if dtype.kind == "f" or datatype is DataType.BF16:
            return rng.normal(size=shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape).astype(dtype)
        return rng.integers(0, 100, size=shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


class _WarmupSink:
    """Ends with the request (any number of responses, as Triton's warmup takes them) and keeps
    the errors of its responses."""

    __slots__ = ("errors", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[None] = loop.create_future()
        self.errors: list[str] = []

    @property
    def done(self) -> bool:
        return self.future.done()

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        if response is not None and response.error is not None:
            self.errors.append(response.error.message)
        if final and not self.future.done():
            self.future.set_result(None)

    def fail(self, error: CoreserveError) -> None:
        if not self.future.done():
            self.errors.append(error.message)
            self.future.set_result(None)


async def run_warmups(
    version: ModelVersion,
    model_path: Path,
    instances: Sequence[tuple[ModelInstance, str]],
    statistics: ModelStatistics,
) -> None:
    """As Triton: each instance (with its name) runs each warmup sample `count` times, its
    `batch_size` requests of batch 1 at once (one at a time for a model that cannot batch),
    straight on the instance: no queue, no sequence batcher, any number of responses; counted
    in `statistics`. Raises ModelConfigError naming the sample: Triton's words for a failed run."""
    config = version.config
    decoupled = config.model_transaction_policy.decoupled
    for warmup in config.model_warmup:
        if warmup.batch_size == 0:
            logger.debug("Skipping batch 0 warmup sample '%s'", warmup.name)
            continue
        for instance, instance_name in instances:
            for iteration in range(1, max(1, warmup.count) + 1):
                logger.debug(
                    "model '%s' instance %s is running warmup sample '%s' for iteration %d",
                    config.name,
                    instance_name,
                    warmup.name,
                    iteration,
                )
                requests = [_request(version, warmup, model_path) for _ in range(warmup.batch_size)]
                batches = [requests] if config.max_batch_size > 0 else [[request] for request in requests]
                errors: list[str] = []
                for batch in batches:
                    sinks = {id(request): _sink_of(request) for request in batch}  # (execution wraps them)
                    responder = await execute_batch(
                        instance, batch, version.signature, statistics, decoupled=decoupled
                    )
                    # What the instance handed back ends here (no queue takes it again): a request
                    # it reschedules has run, and one it requeues (its process died) fails.
                    for request in responder.rescheduled:
                        sinks[id(request)].send(None, True)
                    for request, error in responder.requeued:
                        sinks[id(request)].fail(error)
                    for sink in sinks.values():
                        await sink.future
                        errors += sink.errors
                if errors:
                    raise ModelConfigError(
                        f"failed to run warmup sample '{warmup.name}': " + "".join(f"{e}; " for e in errors)
                    )


def _sink_of(request: InferenceRequest) -> _WarmupSink:
    assert isinstance(request.sink, _WarmupSink)  # (as _request made it)
    return request.sink


def _request(version: ModelVersion, warmup: ModelWarmup, model_path: Path) -> InferenceRequest:
    """One request of batch 1 (when the model batches) of a sample; its inputs are checked as a
    client's, but for those the configuration does not declare, which reach the model unchecked
    (Triton's "input override")."""
    config = version.config
    inputs = {}
    for name, spec in warmup.inputs.items():
        shape = tuple(spec.dims)
        if config.max_batch_size > 0:
            shape = (1, *shape)
        inputs[name] = _sample(name, spec, shape, model_path, config.name)
    declared = {name: array for name, array in inputs.items() if name in version.signature.inputs}
    request = InferenceRequest(model_name=config.name, model_version=str(version.version), inputs=declared)
    try:
        version.signature.check_request(request)
    except CoreserveError as exc:
        raise ModelConfigError(
            f"model '{config.name}' version {version.version}: warmup '{warmup.name}' failed: {exc.message}"
        ) from None
    request.inputs.update((name, array) for name, array in inputs.items() if name not in declared)
    request.sink = _WarmupSink(asyncio.get_running_loop())
    return request
