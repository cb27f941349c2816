"""plugin-tensorflow on real SavedModels and a frozen GraphDef built with TensorFlow itself
(tests/plugins/tensorflow/tf_model_builders.py, in a process of its own)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tf_repository import GRAPHDEF_CONFIG as GRAPHDEF
from tf_repository import built_models
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from coreserve.testing import ServerProcess
from support.datatypes import CONFIG_TYPE, NUMPY

NUMPY_TYPES = {**NUMPY, "BF16": ml_dtypes.bfloat16}  # every type TensorFlow shares with v2


def _copy(built: Path, repository: Path, source: str, name: str, config: str | None) -> None:
    shutil.copytree(built / source, repository / name)
    if config is not None:
        (repository / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    built = built_models(tmp_path_factory)
    repository = tmp_path_factory.mktemp("tf-repository")
    _copy(built, repository, "affine", "affine", None)  # no config.pbtxt at all: found and completed
    _copy(
        built,
        repository,
        "affine",
        "batched",
        'backend: "tensorflow"\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 300000 }\n"
        'parameters { key: "TF_NUM_INTRA_THREADS" value: { string_value: "1" } }\n'
        'parameters { key: "TF_NUM_INTER_THREADS" value: { string_value: "1" } }\n',
    )
    _copy(
        built,
        repository,
        "signatures",
        "triple",
        'platform: "tensorflow_savedmodel"\n'
        'parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "triple" } }\n',
    )
    _copy(built, repository, "identities", "identities", 'backend: "tensorflow"')
    _copy(built, repository, "graphdef", "graphdef", GRAPHDEF)
    # Models that must not load, each for its own reason.
    _copy(
        built,
        repository,
        "signatures",
        "bad_signature",
        'backend: "tensorflow"\nparameters { key: "TF_SIGNATURE_DEF" value: { string_value: "nope" } }\n',
    )
    _copy(built, repository, "graphdef", "graphdef_wrong_name", GRAPHDEF.replace('name: "x"', 'name: "nope"'))
    _copy(
        built, repository, "affine", "gpu", 'backend: "tensorflow"\ninstance_group [ { kind: KIND_GPU } ]\n'
    )
    garbage = repository / "garbage" / "1" / "model.savedmodel"
    garbage.mkdir(parents=True)
    (garbage / "saved_model.pb").write_bytes(b"not a saved model")
    (repository / "garbage" / "config.pbtxt").write_text('backend: "tensorflow"')
    process = ServerProcess([repository], ["--exit-on-error=false"]).start(timeout=240)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def _tensor(name: str, array: np.ndarray, datatype: str | None = None) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype or np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array, binary_data=True)
    return tensor


def _affine_inputs(rows: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    # s is one string per row: dims [1] in the completed config (reshaped to the SavedModel's [N]).
    s = np.array([[b"ab"], [b"xyz"], [b""]][:rows], dtype=np.object_)
    return x, s


def test_savedmodel_without_config_is_found_and_completed(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("affine")
    assert config["platform"] == "tensorflow_savedmodel" and config["backend"] == "tensorflow"
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert sorted((t["name"], t["data_type"], t["dims"]) for t in config["input"]) == [
        ("s", "TYPE_STRING", [1]),
        ("x", "TYPE_FP32", [4]),
    ]
    assert sorted((t["name"], t["data_type"], t["dims"]) for t in config["output"]) == [
        ("n", "TYPE_INT32", [1]),
        ("u", "TYPE_STRING", [1]),
        ("y", "TYPE_FP32", [4]),
    ]
    assert {t["name"]: t.get("reshape") for t in config["input"]} == {"s": {"shape": []}, "x": None}
    x, s = _affine_inputs(3)
    result = client.infer("affine", [_tensor("x", x), _tensor("s", s)])
    np.testing.assert_array_equal(result.as_numpy("y"), 2 * x + 1)
    np.testing.assert_array_equal(result.as_numpy("n"), [[2], [3], [0]])
    assert result.as_numpy("u").tolist() == [[b"AB"], [b"XYZ"], [b""]]


def test_signature_named_in_parameters(client: httpclient.InferenceServerClient) -> None:
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(client.infer("triple", [_tensor("x", x)]).as_numpy("y"), 3 * x)


def _sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([[b"a", b"\x00b"], [b"", b"cd"]], dtype=np.object_)
    if datatype == "BOOL":
        return np.array([[True, False], [False, True]])
    return np.array([[1, 2], [3, 100]]).astype(NUMPY_TYPES[datatype])


def test_every_shared_datatype_round_trips(client: httpclient.InferenceServerClient) -> None:
    samples = {datatype: _sample(datatype) for datatype in NUMPY_TYPES}
    result = client.infer("identities", [_tensor(f"i_{t}", array, t) for t, array in samples.items()])
    for datatype, array in samples.items():
        answer = result.as_numpy(f"o_{datatype}")
        assert answer.tolist() == array.tolist(), datatype
    config = client.get_model_config("identities")
    assert {t["name"]: t["data_type"] for t in config["output"]} == {
        f"o_{t}": CONFIG_TYPE[t] for t in NUMPY_TYPES
    }


def test_frozen_graphdef(client: httpclient.InferenceServerClient) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(client.infer("graphdef", [_tensor("x", x)]).as_numpy("y"), x + 10)


def test_grpc_with_bytes(server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x, s = _affine_inputs(2)
        inputs = [grpcclient.InferInput("x", [2, 4], "FP32"), grpcclient.InferInput("s", [2, 1], "BYTES")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(s)
        result = grpc.infer("affine", inputs)
        assert result.as_numpy("u").tolist() == [[b"AB"], [b"XYZ"]]
        np.testing.assert_array_equal(result.as_numpy("y"), 2 * x + 1)
    finally:
        grpc.close()


def test_dynamic_batching_with_two_instances_and_thread_settings(server: ServerProcess) -> None:
    def call(value: int) -> list[float]:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            x = np.full((1, 4), value, np.float32)
            s = np.array([[b"q" * value]], dtype=np.object_)
            result = client.infer("batched", [_tensor("x", x), _tensor("s", s)])
            assert result.as_numpy("n").tolist() == [[value]]
            return result.as_numpy("y").ravel().tolist()
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, range(8)))
    assert answers == [[2.0 * v + 1] * 4 for v in range(8)]
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics("batched")["model_stats"][0]
    finally:
        client.close()
    assert stats["inference_count"] == 8 and stats["execution_count"] < 8


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            "bad_signature",
            "the SavedModel has no signature 'nope' (its signatures: ['serving_default', 'triple'])",
        ),
        ("graphdef_wrong_name", "configuration input 'nope' is not a tensor of the GraphDef"),
        ("gpu", "instance group gpu_0 of model gpu has kind KIND_GPU but no GPUs are available"),
        ("garbage", "TensorFlow cannot load the SavedModel"),
    ],
)
def test_unavailable_models_say_why(
    client: httpclient.InferenceServerClient, model: str, reason: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(model)
    assert reason in info.value.message()
    assert client.is_model_ready("affine")


def test_log_has_no_traceback(server: ServerProcess) -> None:
    assert "Traceback" not in server.log, server.log[-4000:]
