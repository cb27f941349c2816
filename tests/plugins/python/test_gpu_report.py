"""Where Python model instances run: the python backend reports the GPUs the CUDA driver shows,
so that (as on Triton, whose python backend prefers GPU instances where there are GPUs) a model
without instance_group gets an instance on each GPU, and on a machine without one stays on the
CPU while KIND_GPU makes the model UNAVAILABLE. The model answers the kind and device its
`args` gave it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.backend import cuda_driver_gpus
from coreserve.testing import ServerFactory, ServerProcess

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.where = f"{args['model_instance_kind']} {args['model_instance_device_id']}".encode()

    def execute(self, requests):
        where = pb_utils.Tensor("WHERE", np.array([self.where], dtype=np.object_))
        return [pb_utils.InferenceResponse([where]) for _ in requests]
"""
CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
GROUPS = {"no_group": "", "gpu": "instance_group [ { kind: KIND_GPU } ]"}


def _where(client: httpclient.InferenceServerClient, model: str) -> str:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    return str(client.infer(model, [tensor]).as_numpy("WHERE")[0].decode())


def test_instances_go_where_the_cuda_driver_shows_gpus(
    tmp_path: Path,
    coreserve_server: ServerFactory,
    http_client: Callable[[ServerProcess], httpclient.InferenceServerClient],
) -> None:
    for name, groups in GROUPS.items():
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(CONFIG + groups)
        (tmp_path / name / "1" / "model.py").write_text(MODEL)
    server = coreserve_server(tmp_path, "--exit-on-error=false")
    client = http_client(server)
    gpus = cuda_driver_gpus()
    groups = client.get_model_config("no_group")["instance_group"]
    if gpus:
        assert [(g["kind"], g["gpus"]) for g in groups] == [("KIND_GPU", list(gpus))]
        assert _where(client, "no_group").split()[0] == "GPU"
        assert _where(client, "gpu").split()[0] == "GPU"
        return
    assert [g["kind"] for g in groups] == ["KIND_CPU"]
    assert _where(client, "no_group") == "CPU 0"
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("gpu")
    assert (
        "instance group gpu_0 of model gpu has kind KIND_GPU but no GPUs are available "
        "(backend 'python' reports no GPU it can use" in info.value.message()
    )
    assert "Traceback" not in server.log
