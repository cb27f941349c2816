"""DLPack tensors in real model.py files served by a real server: torch work whose result is
returned through `Tensor.from_dlpack`, inputs in CPU memory whatever FORCE_CPU_ONLY_INPUT_TENSORS
says (coreserve's inputs always reach a model in host memory), and tensors in GPU memory leaving
the stub as outputs and BLS inputs (copied to host memory there). The CUDA model runs where
torch sees a CUDA device and skips elsewhere."""

from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.model_builders import write_model

CUDA = torch.cuda.is_available()

# Adds one to INPUT0 with torch on the device its parameter DEVICE names; WHERE tells where the
# input arrived and where the output was.
TORCH_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters [
  { key: "DEVICE" value: { string_value: "%s" } },
  { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "%s" } }
]
"""
TORCH_MODEL = """
import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = json.loads(args["model_config"])["parameters"]["DEVICE"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            given = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            result = torch.from_dlpack(given.to_dlpack()).to(self.device) + 1
            output = pb_utils.Tensor.from_dlpack("OUTPUT0", result)
            where = f"input_cpu={given.is_cpu()} output_cpu={output.is_cpu()}"
            responses.append(pb_utils.InferenceResponse([
                output, pb_utils.Tensor("WHERE", np.array([where.encode()], dtype=np.object_))
            ]))
        return responses
"""
# Doubles INPUT0 into a tensor that reports CUDA memory (a DLPack producer standing for a GPU
# framework on machines without one), answers it as OUTPUT0 and sends it by BLS to torch_cpu,
# whose OUTPUT0 it answers as PLUS_ONE.
REPORTED_GPU_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "PLUS_ONE" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
REPORTED_GPU_MODEL = """
import triton_python_backend_utils as pb_utils


class ReportsCuda:
    def __init__(self, data):
        self.data = data

    def __dlpack__(self, stream=None, **options):
        return self.data.__dlpack__()

    def __dlpack_device__(self):
        return (2, 0)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            doubled = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy() * 2
            output = pb_utils.Tensor.from_dlpack("OUTPUT0", ReportsCuda(doubled))
            assert not output.is_cpu()
            call = pb_utils.InferenceRequest(
                model_name="torch_cpu",
                inputs=[pb_utils.Tensor.from_dlpack("INPUT0", ReportsCuda(doubled))],
                requested_output_names=["OUTPUT0"],
            ).exec()
            if call.has_error():
                raise pb_utils.TritonModelException(call.error().message())
            plus_one = pb_utils.get_output_tensor_by_name(call, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([output, pb_utils.Tensor("PLUS_ONE", plus_one)]))
        return responses
"""

# Triton's QA identity_bf16, in our words: BF16 in, doubled by torch through DLPack, BF16 out;
# REFUSED holds what as_numpy() said of the input and of the output (it refuses BF16).
BF16_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_BF16 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_BF16 dims: [ 2 ] }, { name: "REFUSED" data_type: TYPE_STRING dims: [ 2 ] } ]
"""
BF16_MODEL = """
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


def refusal(tensor):
    try:
        tensor.as_numpy()
    except pb_utils.TritonModelException as exc:
        return str(exc).encode()
    return b"taken"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            given = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            doubled = torch.utils.dlpack.from_dlpack(given.to_dlpack()) * 2
            output = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(doubled))
            refused = np.array([refusal(given), refusal(output)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([output, pb_utils.Tensor("REFUSED", refused)]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("pb-dlpack")
    write_model(root, "torch_cpu", TORCH_MODEL.encode(), TORCH_CONFIG % ("cpu", "no"), filename="model.py")
    write_model(root, "reported_gpu", REPORTED_GPU_MODEL.encode(), REPORTED_GPU_CONFIG, filename="model.py")
    write_model(
        root, "force_cpu_maybe", TORCH_MODEL.encode(), TORCH_CONFIG % ("cpu", "Yes"), filename="model.py"
    )
    write_model(root, "bf16", BF16_MODEL.encode(), BF16_CONFIG, filename="model.py")
    loaded = ["torch_cpu", "reported_gpu", "bf16"]
    if CUDA:
        write_model(
            root, "torch_cuda", TORCH_MODEL.encode(), TORCH_CONFIG % ("cuda", "yes"), filename="model.py"
        )
        loaded.append("torch_cuda")
    server = ServerProcess(
        [root], ["--model-control-mode=explicit", *(f"--load-model={name}" for name in loaded)]
    )
    server.start(timeout=120)
    yield server
    server.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    yield client
    client.close()


def _infer(
    client: httpclient.InferenceServerClient, model: str, values: list[float]
) -> httpclient.InferResult:
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return client.infer(model, [tensor])


def test_torch_results_return_through_from_dlpack(client: httpclient.InferenceServerClient) -> None:
    result = _infer(client, "torch_cpu", [1.0, 2.0, 3.0, 4.0])
    assert result.as_numpy("OUTPUT0").tolist() == [2.0, 3.0, 4.0, 5.0]
    # FORCE_CPU_ONLY_INPUT_TENSORS "no": inputs are in host memory here all the same
    assert result.as_numpy("WHERE")[0] == b"input_cpu=True output_cpu=True"


def test_bf16_tensors_go_through_dlpack_and_not_numpy_as_on_triton(
    client: httpclient.InferenceServerClient,
) -> None:
    """Triton's QA identity_bf16 (L0_backend_python test_bf16): to_dlpack() failed here, and
    as_numpy() gave an array where Triton refuses."""
    tensor = httpclient.InferInput("INPUT0", [2], "BF16")
    tensor.set_data_from_numpy(np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16))
    result = client.infer("bf16", [tensor])
    assert result.as_numpy("OUTPUT0").astype(np.float32).tolist() == [3.0, -4.0]
    refusal = (
        b"Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
    )
    assert result.as_numpy("REFUSED").tolist() == [refusal, refusal]


def test_tensors_in_gpu_memory_leave_the_stub_as_outputs_and_bls_inputs(
    client: httpclient.InferenceServerClient,
) -> None:
    result = _infer(client, "reported_gpu", [0.5, 1.0, -2.0, 8.0])
    assert result.as_numpy("OUTPUT0").tolist() == [1.0, 2.0, -4.0, 16.0]
    assert result.as_numpy("PLUS_ONE").tolist() == [2.0, 3.0, -3.0, 17.0]


def test_force_cpu_only_input_tensors_takes_yes_or_no(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("force_cpu_maybe")
    assert "Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: Yes'" in caught.value.message()
    assert client.is_model_ready("torch_cpu") and not client.is_model_ready("force_cpu_maybe")
    assert "Traceback" not in server.log  # a configuration mistake, not a server fault


@pytest.mark.skipif(not CUDA, reason="no CUDA: torch sees no CUDA device")
def test_a_cuda_tensor_returned_by_a_model_reaches_the_client(
    client: httpclient.InferenceServerClient,
) -> None:
    for start in (0.0, 100.0):  # twice: the second request reuses the stub's CUDA context
        values = [start, start + 1, start + 2, start + 3]
        result = _infer(client, "torch_cuda", values)
        assert result.as_numpy("OUTPUT0").tolist() == [value + 1 for value in values]
        assert result.as_numpy("WHERE")[0] == b"input_cpu=True output_cpu=False"
