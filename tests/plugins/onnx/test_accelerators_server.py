"""Execution accelerators and device reports of the onnxruntime backend, through a real server.

The CPU build of onnxruntime (the one installed here) has only the CPU provider: accelerators
it lacks make their model UNAVAILABLE (or are left out when optional), the backend reports no
GPU (so models without instance_group stay on the CPU and KIND_GPU is refused by the core with
the backend's name). With $CORESERVE_ORT_OPENVINO naming a folder that holds onnxruntime-openvino
(`pip install --target DIR --no-deps onnxruntime-openvino`), the OpenVINO provider runs for real;
with onnxruntime-gpu and a GPU, the CUDA provider does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.backend import cuda_driver_gpus
from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import add_sub_model, write_model

ClientFactory = Callable[[ServerProcess], httpclient.InferenceServerClient]
OPENVINO = 'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }'
OPTIONAL = 'parameters { key: "optional_execution_accelerators" value: { string_value: "%s" } }'
TENSORRT = 'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" %s } ] } }'
MODELS = {
    "no_group": "",
    "cpu_group": "instance_group [ { kind: KIND_CPU count: 2 } ]",
    "gpu_group": "instance_group [ { kind: KIND_GPU } ]",
    "openvino": OPENVINO + " instance_group [ { kind: KIND_CPU } ]",
    "openvino_optional": OPENVINO
    + " instance_group [ { kind: KIND_CPU count: 2 } ] "
    + OPTIONAL % "openvino",
    "misspelled": 'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensort" } ] } }',
    "bad_precision": TENSORRT % 'parameters { key: "precision_mode" value: "FP64" }',
    # GPU accelerators do not apply to CPU instances: this loads on the CPU build.
    "tensorrt_on_cpu": TENSORRT % "" + " instance_group [ { kind: KIND_CPU } ]",
    # TensorRT is optional here: onnxruntime-gpu lists its provider even where TensorRT itself is
    # not installed, and then the session starts without it (with a warning).
    "gpu_tensorrt": TENSORRT % "" + " " + OPTIONAL % "tensorrt",
}
CONFIG = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""
HAS_OPENVINO = "OpenVINOExecutionProvider" in ort.get_available_providers()
HAS_GPU = "CUDAExecutionProvider" in ort.get_available_providers() and bool(cuda_driver_gpus())


def _repository(root: Path, names: tuple[str, ...]) -> Path:
    model = add_sub_model("FP32", ["batch", 3])
    for name in names:
        write_model(root, name, model, CONFIG + MODELS[name])
    return root


def _reason(client: httpclient.InferenceServerClient, model: str) -> str:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(model)
    return str(info.value.message())


def _infer(client: httpclient.InferenceServerClient, model: str) -> None:
    a = np.array([[1.0, 2.0, 3.0]], np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 3], "FP32")
        tensor.set_data_from_numpy(a)
        inputs.append(tensor)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros_like(a))


def _runs_on(server: ServerProcess, model: str) -> list[tuple[str, str]]:
    return sorted(re.findall(rf"model '{model}': instance '(\S+)' runs on ([\w, ]+)", server.log))


@pytest.mark.skipif(HAS_OPENVINO or HAS_GPU, reason="this onnxruntime has more than the CPU provider")
def test_cpu_build(coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path) -> None:
    server = coreserve_server(_repository(tmp_path, tuple(MODELS)), "--exit-on-error=false")
    client = http_client(server)
    # No GPU reported: no instance_group means CPU, two instances as Triton's onnxruntime
    # backend has them; KIND_GPU is refused by the core.
    assert _runs_on(server, "no_group") == [(f"no_group_{k}", "CPUExecutionProvider") for k in range(2)]
    assert [g["kind"] for g in client.get_model_config("no_group")["instance_group"]] == ["KIND_CPU"]
    assert len(_runs_on(server, "cpu_group")) == 2
    assert (
        "instance group gpu_group_0 of model gpu_group has kind KIND_GPU but no GPUs are available "
        "(backend 'onnxruntime' reports no GPU it can use" in _reason(client, "gpu_group")
    )
    assert (
        "execution accelerator 'openvino' needs OpenVINOExecutionProvider, which this onnxruntime build "
        "lacks (it has " in _reason(client, "openvino")
    )
    assert "unknown Execution Accelerator 'tensort' is requested" in _reason(client, "misspelled")
    assert "unsupported precision mode 'FP64' is requested" in _reason(client, "bad_precision")
    for model in ("no_group", "openvino_optional", "tensorrt_on_cpu", "gpu_tensorrt"):
        _infer(client, model)
    # One warning for each instance that runs without its optional accelerator.
    skipped = re.findall(r"instance '(\S+)' runs without it \(it is listed in", server.log)
    assert sorted(skipped) == ["openvino_optional_0_0", "openvino_optional_0_1"]
    assert "Traceback" not in server.log
    assert client.is_server_live()


@pytest.fixture
def openvino_build() -> Path:
    folder = os.environ.get("CORESERVE_ORT_OPENVINO", "")
    if not folder or not (Path(folder) / "onnxruntime").is_dir():
        pytest.skip(
            "set CORESERVE_ORT_OPENVINO to a folder holding onnxruntime-openvino "
            "(pip install --target DIR --no-deps onnxruntime-openvino) to run the OpenVINO provider"
        )
    return Path(folder)


def test_openvino_provider_runs_where_the_build_has_it(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path, openvino_build: Path
) -> None:
    path = os.pathsep.join([str(openvino_build), os.environ.get("PYTHONPATH", "")])
    repository = _repository(tmp_path, ("openvino", "openvino_optional", "no_group"))
    # A model file onnxruntime cannot read fails with any providers: reported as it is, with no
    # warning that the optional accelerator was left out.
    write_model(repository, "garbage", b"not onnx", CONFIG + MODELS["openvino_optional"])
    server = coreserve_server(repository, "--exit-on-error=false", env={"PYTHONPATH": path})
    client = http_client(server)
    assert "model 'garbage': onnxruntime cannot load" in _reason(client, "garbage")
    for model in ("openvino", "openvino_optional", "no_group"):
        _infer(client, model)
    # A CPU group without a count has two instances, as on Triton.
    assert _runs_on(server, "openvino") == [
        (f"openvino_0_{k}", "OpenVINOExecutionProvider, CPUExecutionProvider") for k in range(2)
    ]
    assert [provider for _, provider in _runs_on(server, "openvino_optional")] == [
        "OpenVINOExecutionProvider, CPUExecutionProvider"
    ] * 2
    assert _runs_on(server, "no_group") == [(f"no_group_{k}", "CPUExecutionProvider") for k in range(2)]
    assert "runs without" not in server.log and "Traceback" not in server.log


@pytest.mark.skipif(
    not HAS_GPU, reason="no GPU: needs onnxruntime-gpu (plugin-onnx[gpu]) and a GPU the CUDA driver shows"
)
def test_gpu_build_places_models_on_every_gpu(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path
) -> None:
    server = coreserve_server(_repository(tmp_path, ("no_group", "cpu_group", "gpu_tensorrt")))
    client = http_client(server)
    gpus = cuda_driver_gpus()
    for model in ("no_group", "cpu_group", "gpu_tensorrt"):
        _infer(client, model)
    groups = client.get_model_config("no_group")["instance_group"]
    assert [(g["kind"], g["gpus"]) for g in groups] == [("KIND_GPU", list(gpus))]
    assert all("CUDAExecutionProvider" in providers for _, providers in _runs_on(server, "no_group"))
    assert len(_runs_on(server, "no_group")) == len(gpus)
    assert all(providers == "CPUExecutionProvider" for _, providers in _runs_on(server, "cpu_group"))
    assert "Traceback" not in server.log
