"""plugin-openvino on real models: IR built with OpenVINO's API, ONNX read by OpenVINO."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
import tritonclient.http as httpclient
from openvino import opset13 as ops
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.model_builders import add_sub_model, write_model


def ir_add_mul(folder: Path, batch: int | None = None) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 * INPUT1 (FP32 [batch, 4]) as model.xml/.bin."""
    first = -1 if batch is None else batch
    a = ops.parameter([first, 4], ov.Type.f32, name="INPUT0")
    b = ops.parameter([first, 4], ov.Type.f32, name="INPUT1")
    total, product = ops.add(a, b), ops.multiply(a, b)
    total.output(0).get_tensor().set_names({"OUTPUT0"})
    product.output(0).get_tensor().set_names({"OUTPUT1"})
    folder.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.Model([total, product], [a, b], "add_mul"), str(folder / "model.xml"))


def ir_matmul(folder: Path) -> None:
    """y = x @ W (FP32 [batch, 4] x [4, 4]) with weights that bfloat16 cannot hold exactly."""
    x = ops.parameter([-1, 4], ov.Type.f32, name="x")
    weights = np.full((4, 4), 1.0 + 2.0**-12, np.float32)
    product = ops.matmul(x, ops.constant(weights), False, False)
    product.output(0).get_tensor().set_names({"y"})
    folder.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.Model([product], [x], "matmul"), str(folder / "model.xml"), compress_to_fp16=False)


EXPLICIT = """
backend: "openvino"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("openvino")
    ir_add_mul(repository / "auto" / "1")  # no config.pbtxt: completed from the IR
    (repository / "auto" / "config.pbtxt").write_text('backend: "openvino"')
    ir_add_mul(repository / "static_batch" / "1", batch=1)
    (repository / "static_batch" / "config.pbtxt").write_text(EXPLICIT)
    ir_add_mul(repository / "batched" / "1")
    (repository / "batched" / "config.pbtxt").write_text(
        EXPLICIT
        + "instance_group [ { count: 2 } ]\ndynamic_batching { max_queue_delay_microseconds: 300000 }\n"
        'parameters { key: "PERFORMANCE_HINT" value: { string_value: "THROUGHPUT" } }\n'
        'parameters { key: "NUM_STREAMS" value: { string_value: "2" } }\n'
        'parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }\n'
    )
    write_model(
        repository,
        "from_onnx",
        add_sub_model("FP32", ["batch", 4]),
        'backend: "openvino"\ndefault_model_filename: "model.onnx"',
    )
    ir_add_mul(repository / "bad_hint" / "1")
    (repository / "bad_hint" / "config.pbtxt").write_text(
        EXPLICIT + 'parameters { key: "PERFORMANCE_HINT" value: { string_value: "FASTEST" } }'
    )
    ir_add_mul(repository / "bad_precision" / "1")
    (repository / "bad_precision" / "config.pbtxt").write_text(
        EXPLICIT + 'parameters { key: "INFERENCE_PRECISION_HINT" value: { string_value: "f8" } }'
    )
    ir_matmul(repository / "precise" / "1")
    (repository / "precise" / "config.pbtxt").write_text(
        'backend: "openvino"\nparameters { key: "INFERENCE_PRECISION_HINT" value: { string_value: "F32" } }'
    )
    ir_add_mul(repository / "wrong_names" / "1")
    (repository / "wrong_names" / "config.pbtxt").write_text(EXPLICIT.replace('"INPUT1"', '"OTHER"'))
    (repository / "garbage" / "1").mkdir(parents=True)
    (repository / "garbage" / "1" / "model.xml").write_text("<not an ir>")
    (repository / "garbage" / "config.pbtxt").write_text(EXPLICIT)
    ir_add_mul(repository / "on_gpu" / "1")
    (repository / "on_gpu" / "config.pbtxt").write_text(EXPLICIT + "instance_group [ { kind: KIND_GPU } ]")
    process = ServerProcess([repository], ["--exit-on-error=false"]).start(timeout=120)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def _infer(
    client: httpclient.InferenceServerClient,
    model: str,
    a: np.ndarray,
    b: np.ndarray,
    names: tuple[str, str] = ("INPUT0", "INPUT1"),
) -> httpclient.InferResult:
    inputs = [
        httpclient.InferInput(names[0], list(a.shape), "FP32"),
        httpclient.InferInput(names[1], list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client.infer(model, inputs)


def test_ir_model_with_auto_completed_config(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("auto")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [4]),
        ("OUTPUT1", "TYPE_FP32", [4]),
    ]
    a, b = np.arange(8, dtype=np.float32).reshape(2, 4), np.full((2, 4), 2, np.float32)
    result = _infer(client, "auto", a, b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * b)


def test_static_first_dimension_is_made_dynamic(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(_infer(client, "static_batch", a, a).as_numpy("OUTPUT0"), 2 * a)


def test_onnx_read_by_openvino(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = _infer(client, "from_onnx", a, np.ones_like(a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)
    assert client.get_model_config("from_onnx")["platform"] == "openvino"


def test_precision_hint_f32_keeps_fp32_results(client: httpclient.InferenceServerClient) -> None:
    x = np.full((2, 4), 1.0 + 2.0**-11, np.float32)
    tensor = httpclient.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("precise", [tensor]).as_numpy("y")
    np.testing.assert_allclose(result, x @ np.full((4, 4), 1.0 + 2.0**-12, np.float32), rtol=1e-6)


def test_without_gpus_kind_auto_runs_on_the_cpu(client: httpclient.InferenceServerClient) -> None:
    assert [(g["kind"], g["count"]) for g in client.get_model_config("batched")["instance_group"]] == [
        ("KIND_CPU", 2)
    ]
    assert [g["kind"] for g in client.get_model_config("auto")["instance_group"]] == ["KIND_CPU"]


def test_dynamic_batching_with_two_instances(server: ServerProcess) -> None:
    def call(value: int) -> list[float]:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            a = np.full((1, 4), value, np.float32)
            return _infer(client, "batched", a, a).as_numpy("OUTPUT1").ravel().tolist()
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    assert results == [[float(v * v)] * 4 for v in range(8)]
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics("batched")["model_stats"][0]
    finally:
        client.close()
    assert stats["inference_count"] == 8 and stats["execution_count"] < 8


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("bad_hint", "parameter 'PERFORMANCE_HINT' must be one of LATENCY, THROUGHPUT"),
        ("bad_precision", "parameter 'INFERENCE_PRECISION_HINT' must be one of f32, bf16, f16, got 'f8'"),
        ("wrong_names", "configuration input 'OTHER' is not an input of the OpenVINO model"),
        ("garbage", "OpenVINO cannot read"),
        # The backend reports the devices of OpenVINO's GPU plugin: none here, so the core refuses.
        ("on_gpu", "has kind KIND_GPU but no GPUs are available (backend 'openvino' reports no GPU"),
    ],
)
def test_unavailable_models_say_why(
    client: httpclient.InferenceServerClient, model: str, reason: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(model)
    assert info.value.status() == "404" and reason in info.value.message()
    assert client.is_model_ready("auto")
