"""The server as `coreserve analyze` sees it: one gRPC channel speaking KServe v2 and Triton's
repository and statistics extensions, so it measures coreserve and Triton alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from coreserve.config.json import config_to_dict
from coreserve.protocol.tensors import array_to_bytes
from coreserve.protos import grpc_service_pb2 as pb
from coreserve.protos import grpc_service_pb2_grpc as pb_grpc
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.types import DataType

# Answers and model loads can be large, and loads slow (a Python model starts processes).
MAX_MESSAGE = 256 * 1024 * 1024
CONTROL_TIMEOUT_S = 300.0
HEALTH_TIMEOUT_S = 5.0


class ServerGone(Exception):
    """The server stopped answering: the sweep stops, and a later run resumes it."""


class LoadFailed(Exception):
    """The server refused a configuration of the model: a row of the report, not the end."""


@dataclass
class StatsSnapshot:
    """A model's cumulative statistics at one moment (Triton's statistics extension)."""

    success_count: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0

    def per_request_ms(self, earlier: StatsSnapshot) -> tuple[float, float, float, float]:
        """Queue, compute input, infer and output of an average request between two snapshots."""
        count = self.success_count - earlier.success_count
        if count <= 0:
            return (0.0, 0.0, 0.0, 0.0)
        spans = (
            self.queue_ns - earlier.queue_ns,
            self.compute_input_ns - earlier.compute_input_ns,
            self.compute_infer_ns - earlier.compute_infer_ns,
            self.compute_output_ns - earlier.compute_output_ns,
        )
        first, second, third, fourth = (span / count / 1e6 for span in spans)
        return (first, second, third, fourth)


class ServerClient:
    """Control calls of one server (address `host:port` of its gRPC endpoint)."""

    def __init__(self, address: str) -> None:
        self.address = address
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
        ]
        self.channel = grpc.aio.insecure_channel(address, options=options)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, method: str, request: Any, timeout: float = CONTROL_TIMEOUT_S) -> Any:
        try:
            return await getattr(self.stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            await self.check_unavailable(exc)
            raise

    async def check_unavailable(self, exc: grpc.aio.AioRpcError) -> None:
        """Raises ServerGone where `exc` says the server cannot be reached and it does not
        answer a health check either. UNAVAILABLE alone is not enough: a server that is up
        answers it too (a full queue, a model version not ready, a model unloading)."""
        if (
            exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            and not await self.live()
        ):
            raise ServerGone(f"the server at {self.address} does not answer: {exc.details()}") from None

    async def live(self) -> bool:
        try:
            return bool((await self.stub.ServerLive(pb.ServerLiveRequest(), timeout=HEALTH_TIMEOUT_S)).live)
        except grpc.aio.AioRpcError:
            return False

    async def ready(self) -> bool:
        try:
            return bool(
                (await self.stub.ServerReady(pb.ServerReadyRequest(), timeout=HEALTH_TIMEOUT_S)).ready
            )
        except grpc.aio.AioRpcError:
            return False

    async def model_config(self, model: str) -> ModelConfig:
        answer: pb.ModelConfigResponse = await self._call("ModelConfig", pb.ModelConfigRequest(name=model))
        return answer.config

    async def load(self, model: str, config: ModelConfig | None = None) -> None:
        """Loads (or reloads) `model`, with `config` in place of its own where given."""
        request = pb.RepositoryModelLoadRequest(model_name=model)
        if config is not None:
            request.parameters["config"].string_param = json.dumps(config_to_dict(config))
        try:
            await self._call("RepositoryModelLoad", request)
        except grpc.aio.AioRpcError as exc:
            raise LoadFailed(exc.details() or str(exc.code())) from None

    async def statistics(self, model: str) -> StatsSnapshot:
        answer = await self._call("ModelStatistics", pb.ModelStatisticsRequest(name=model))
        snapshot = StatsSnapshot()
        for version in answer.model_stats:
            stats = version.inference_stats
            snapshot.success_count += stats.success.count
            snapshot.queue_ns += stats.queue.ns
            snapshot.compute_input_ns += stats.compute_input.ns
            snapshot.compute_infer_ns += stats.compute_infer.ns
            snapshot.compute_output_ns += stats.compute_output.ns
        return snapshot

    async def infer_request(self, model: str, batch_size: int = 1) -> pb.ModelInferRequest:
        """A request of random data shaped as the model's metadata says (-1 dimensions are 1;
        a batching model's first is `batch_size`)."""
        metadata = await self._call("ModelMetadata", pb.ModelMetadataRequest(name=model))
        config = await self.model_config(model)
        request = pb.ModelInferRequest(model_name=model)
        generator = np.random.default_rng(0)
        for tensor in metadata.inputs:
            shape = [1 if dim < 0 else dim for dim in tensor.shape]
            if config.max_batch_size > 0 and shape:
                shape[0] = batch_size
            datatype = DataType(tensor.datatype)
            request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=shape)
            request.raw_input_contents.append(
                bytes(array_to_bytes(_random(generator, datatype, shape), datatype))
            )
        return request


def _random(generator: np.random.Generator, datatype: DataType, shape: list[int]) -> np.ndarray:
    if datatype is DataType.BYTES:
        return np.full(shape, b"coreserve", dtype=object)
    if datatype is DataType.BOOL:
        return generator.integers(0, 2, shape).astype(bool)
    dtype = datatype.numpy_dtype
    if np.issubdtype(dtype, np.integer):
        return generator.integers(0, 16, shape).astype(dtype)
    return generator.random(shape).astype(dtype)
