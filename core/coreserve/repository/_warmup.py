"""`model_warmup`: sample requests a model version runs before it reports READY."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from coreserve.errors import CoreserveError, ModelConfigError
from coreserve.protos.model_config_pb2 import ModelWarmup
from coreserve.repository.model import ModelVersion
from coreserve.responses import SingleResponse
from coreserve.types import NUMPY_DTYPES, DataType, InferenceRequest

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


async def run_warmups(version: ModelVersion, model_path: Path) -> None:
    """Sends each warmup sample `count` times; raises ModelConfigError naming the sample."""
    config, scheduler = version.config, version.scheduler
    assert scheduler is not None
    for warmup in config.model_warmup:
        label = f"model '{config.name}' version {version.version}: warmup '{warmup.name}'"
        for _ in range(max(1, warmup.count)):
            inputs = {}
            for name, spec in warmup.inputs.items():
                shape = tuple(spec.dims)
                if config.max_batch_size > 0:
                    shape = (max(1, warmup.batch_size), *shape)
                inputs[name] = _sample(name, spec, shape, model_path, config.name)
            # A sample of an input the configuration does not declare reaches the model unchecked
            # (Triton's "input override"); the declared ones are checked as a client's.
            declared = {name: array for name, array in inputs.items() if name in version.signature.inputs}
            request = InferenceRequest(
                model_name=config.name, model_version=str(version.version), inputs=declared
            )
            sink = SingleResponse(asyncio.get_running_loop())
            request.sink = sink
            try:
                version.signature.check_request(request)
                request.inputs.update((name, array) for name, array in inputs.items() if name not in declared)
                scheduler.submit(request)
                await sink.future
            except CoreserveError as exc:
                raise ModelConfigError(f"{label} failed: {exc.message}") from None
