"""plugin-tensorrt: clear reasons where TensorRT or a GPU is missing; a real engine where both are."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import add_sub_model, write_model

PLAN = """
backend: "tensorrt"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]
"""


def _gpu_count() -> int:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return 0
    error, count = cudart.cudaGetDeviceCount()
    return count if int(error) == 0 else 0


HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
HAS_GPU = _gpu_count() > 0


def _expected_reason() -> str:
    if not HAS_TENSORRT:
        return "plugin-tensorrt needs the TensorRT Python package, which is not installed"
    return "TensorRT engines run on NVIDIA GPUs, and CUDA finds none here"


@pytest.mark.skipif(
    HAS_TENSORRT and HAS_GPU, reason="this machine runs TensorRT: test_engine_on_the_gpu covers it"
)
def test_plan_is_unavailable_with_a_reason_and_others_serve(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    write_model(tmp_path, "engine", b"serialized engine bytes", PLAN, filename="model.plan")
    write_model(
        tmp_path,
        "add_sub",
        add_sub_model("FP32", ["batch", 4]),
        PLAN.replace('"tensorrt"', '"onnxruntime"').replace(
            "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]", ""
        ),
    )
    server = coreserve_server(tmp_path, "--exit-on-error=false")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("engine")
        assert info.value.status() == "404" and _expected_reason() in info.value.message()
        assert client.is_model_ready("add_sub")
    finally:
        client.close()


def _build_engine(onnx_bytes: bytes, path: Path) -> None:
    """Builds a small engine with a dynamic batch profile (1..8) from an ONNX model."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_bytes), [parser.get_error(i) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name in ("INPUT0", "INPUT1"):
        profile.set_shape(name, (1, 4), (4, 4), (8, 4))
    config.add_optimization_profile(profile)
    path.write_bytes(bytes(builder.build_serialized_network(network, config)))


@pytest.fixture
def engine_server(coreserve_server: ServerFactory, tmp_path: Path) -> Iterator[ServerProcess]:
    folder = tmp_path / "engine" / "1"
    folder.mkdir(parents=True)
    _build_engine(add_sub_model("FP32", ["batch", 4]).SerializeToString(), folder / "model.plan")
    (tmp_path / "engine" / "config.pbtxt").write_text(PLAN + "dynamic_batching { }")
    # No instance_group, as plans usually come: one instance on each GPU, as on Triton.
    (tmp_path / "engine_auto" / "1").mkdir(parents=True)
    (tmp_path / "engine_auto" / "1" / "model.plan").write_bytes((folder / "model.plan").read_bytes())
    (tmp_path / "engine_auto" / "config.pbtxt").write_text(
        PLAN.replace("instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]", "")
    )
    yield coreserve_server(tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(
    not (HAS_TENSORRT and HAS_GPU), reason="no TensorRT: needs the tensorrt package and an NVIDIA GPU"
)
def test_engine_on_the_gpu(engine_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(engine_server.http_url)
    try:
        for batch in (1, 3, 8):
            a = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
            inputs = [
                httpclient.InferInput("INPUT0", [batch, 4], "FP32"),
                httpclient.InferInput("INPUT1", [batch, 4], "FP32"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones_like(a))
            result = client.infer("engine", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)
        assert client.get_model_config("engine")["platform"] == "tensorrt_plan"
        groups = client.get_model_config("engine_auto")["instance_group"]
        assert [(g["kind"], g["gpus"]) for g in groups] == [("KIND_GPU", list(range(_gpu_count())))]
        result = client.infer("engine_auto", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
    finally:
        client.close()
