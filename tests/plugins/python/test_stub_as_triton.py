"""What a model's Python process looks like from inside and how its faults are told, as Triton's
stub does it (found running Triton's own QA models side by side): `sys.argv`, BLS outside
`execute`, an exception in `execute` logged as one error, without the stub's traceback, and the
stub's own module `c_python_backend_utils`, which some models import."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
HEAD = """
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


def call():
    request = pb_utils.InferenceRequest(
        model_name="argv", inputs=[pb_utils.Tensor("IN", np.array([1], np.int32))], requested_output_names=["OUT"]
    )
    return request.exec()


def answer(requests, text):
    out = pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))
    return [pb_utils.InferenceResponse([out]) for _ in requests]
"""
MODELS = {
    "argv": "class TritonPythonModel:\n    def execute(self, requests):\n        return answer(requests, json.dumps(sys.argv))\n",
    "bls_in_initialize": "class TritonPythonModel:\n    def initialize(self, args):\n        call()\n",
    "bls_in_finalize": (
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n        return answer(requests, 'fine')\n"
        "    def finalize(self):\n        call()\n"
    ),
    "raises": "class TritonPythonModel:\n    def execute(self, requests):\n        raise ValueError('on purpose')\n",
    "no_return": (  # an auto_complete_config that forgets to return the configuration
        "class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(config):\n"
        "        config.set_max_batch_size(0)\n"
    ),
}
BLS_REFUSED = "BLS is only supported during the 'execute' function."
# Answers with the classes of Triton's C++ module (as models found in the wild do) whether they
# are pb_utils', and the stub's unused shared memory; IN 1 adds a 1 MiB output (a segment of its own).
C_UTILS_CONFIG = CONFIG.replace("output [", 'output [ { name: "BIG" data_type: TYPE_FP32 dims: [ -1 ] },')
C_UTILS_MODEL = """
from typing import List

import c_python_backend_utils as c_utils


class TritonPythonModel:
    def execute(self, requests: List[c_utils.InferenceRequest]) -> List[c_utils.InferenceResponse]:
        responses = []
        for request in requests:
            size = (1 << 18) if pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0] == 1 else 0
            seen = {
                "same": [getattr(c_utils, name) is getattr(pb_utils, name) for name in (
                    "InferenceRequest", "InferenceResponse", "Tensor", "TritonError", "MetricFamily", "Logger"
                )],
                "free": c_utils.shared_memory.free_memory(),
            }
            responses.append(c_utils.InferenceResponse([
                c_utils.Tensor("OUT", np.array([json.dumps(seen).encode()], np.object_)),
                c_utils.Tensor("BIG", np.ones(size, np.float32)),
            ]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("stub-as-triton")
    for name, (config, body) in {
        **{name: (CONFIG, body) for name, body in MODELS.items()},
        "c_utils": (C_UTILS_CONFIG, C_UTILS_MODEL),
    }.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(HEAD + body)
    process = ServerProcess(
        [root], ["--exit-on-error=false", "--model-control-mode=explicit", "--load-model=*"]
    )
    process.start(timeout=120)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        yield client


def _infer(client: httpclient.InferenceServerClient, model: str, value: int = 1) -> str:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return client.infer(model, [tensor]).as_numpy("OUT")[0].decode()


def test_the_model_sees_the_arguments_triton_gives_it(client: httpclient.InferenceServerClient) -> None:
    # (unittest.main() in a model reads them: the stub's own made it run tests named after them)
    assert json.loads(_infer(client, "argv")) == [""]


def test_bls_outside_execute_is_refused_in_tritons_words(
    client: httpclient.InferenceServerClient, server: ServerProcess
) -> None:
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["bls_in_initialize"]["state"] == "UNAVAILABLE"
    assert BLS_REFUSED in index["bls_in_initialize"]["reason"]
    assert _infer(client, "bls_in_finalize") == "fine"
    client.unload_model("bls_in_finalize")
    assert BLS_REFUSED in server.log.split("bls_in_finalize", 1)[1]


def test_an_exception_in_execute_is_logged_as_one_error(
    client: httpclient.InferenceServerClient, server: ServerProcess
) -> None:
    with pytest.raises(InferenceServerException) as info:
        _infer(client, "raises")
    text = "Failed to process the request(s) for model 'raises_0', message: ValueError: on purpose"
    assert info.value.message().startswith(text)
    assert server.log.count(text) == 1
    assert "Traceback" not in server.log and "_stub.py" not in server.log


def test_c_python_backend_utils_gives_pb_utils_classes_and_the_stubs_free_memory(
    client: httpclient.InferenceServerClient,
) -> None:
    first = json.loads(_infer(client, "c_utils", 1))  # its 1 MiB output goes out in a segment,
    second = json.loads(_infer(client, "c_utils", 0))  # which the server released once read;
    third = json.loads(_infer(client, "c_utils", 0))  # a small answer goes inline, not in it
    assert first["same"] == [True] * 6
    assert first["free"] == 0 and second["free"] >= 1 << 20 and third["free"] == second["free"]


def test_an_auto_complete_config_that_returns_nothing_is_told_in_tritons_words(
    client: httpclient.InferenceServerClient,
) -> None:
    entry = {entry["name"]: entry for entry in client.get_model_repository_index()}["no_return"]
    assert entry["state"] == "UNAVAILABLE"
    assert (
        "auto_complete_config function in model 'no_return' must return a valid pb.ModelConfig object."
        in (entry["reason"])
    )
