"""Instances placed as Triton places them, from the GPUs a backend reports: the `gpu_report`
test backend (tests/fixtures/gpu_report_backend) reports the GPUs $GPU_REPORT_GPUS lists and
logs where each of its instances lands."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess

ClientFactory = Callable[[ServerProcess], httpclient.InferenceServerClient]
CONFIG = """
backend: "gpu_report"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
MODELS = {
    "no_group": "",
    "auto": "instance_group [ { kind: KIND_AUTO count: 2 } ]",
    "gpu_each": "instance_group [ { kind: KIND_GPU count: 2 } ]",
    "gpu_listed": "instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]",
    "gpu_absent": "instance_group [ { kind: KIND_GPU gpus: [ 5 ] } ]",
    "cpu": "instance_group [ { kind: KIND_CPU count: 2 } ]",
}


def _repository(root: Path) -> Path:
    for name, groups in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.gpu").write_bytes(b"")
        (root / name / "config.pbtxt").write_text(CONFIG + groups)
    return root


def _start(factory: ServerFactory, root: Path, site: Path, gpus: str) -> ServerProcess:
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return factory(
        _repository(root), "--exit-on-error=false", env={"PYTHONPATH": path, "GPU_REPORT_GPUS": gpus}
    )


def _placements(server: ServerProcess, model: str) -> list[tuple[str, str, int]]:
    found = re.findall(rf"placed {model}/(\S+) on (\w+) (\d+)", server.log)
    return sorted((name, kind, int(device)) for name, kind, device in found)


def _reason(client: httpclient.InferenceServerClient, model: str) -> str:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(model)
    return info.value.message()


def test_two_reported_gpus(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path, gpu_report_backend_site: Path
) -> None:
    server = _start(coreserve_server, tmp_path, gpu_report_backend_site, "0,1")
    client = http_client(server)
    # No instance_group, as a TensorRT plan usually has: one instance on each GPU.
    assert _placements(server, "no_group") == [("no_group_0", "GPU", 0), ("no_group_0", "GPU", 1)]
    assert [(g["kind"], g["gpus"]) for g in client.get_model_config("no_group")["instance_group"]] == [
        ("KIND_GPU", [0, 1])
    ]
    assert _placements(server, "auto") == [
        ("auto_0_0", "GPU", 0),
        ("auto_0_0", "GPU", 1),
        ("auto_0_1", "GPU", 0),
        ("auto_0_1", "GPU", 1),
    ]
    assert _placements(server, "gpu_each") == [
        ("gpu_each_0_0", "GPU", 0),
        ("gpu_each_0_0", "GPU", 1),
        ("gpu_each_0_1", "GPU", 0),
        ("gpu_each_0_1", "GPU", 1),
    ]
    assert _placements(server, "gpu_listed") == [("gpu_listed_0_0", "GPU", 1)]
    assert _placements(server, "cpu") == [("cpu_0_0", "CPU", 0), ("cpu_0_1", "CPU", 0)]
    assert (
        "specifies invalid or unsupported gpu id 5; the GPUs backend 'gpu_report' can use are: 0, 1"
        in _reason(client, "gpu_absent")
    )
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.5, 2.5]], np.float32))
    np.testing.assert_array_equal(client.infer("gpu_each", [tensor]).as_numpy("OUTPUT0"), [[1.5, 2.5]])


def test_no_reported_gpu(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path, gpu_report_backend_site: Path
) -> None:
    server = _start(coreserve_server, tmp_path, gpu_report_backend_site, "")
    client = http_client(server)
    assert _placements(server, "no_group") == [("no_group_0", "CPU", 0)]
    assert _placements(server, "auto") == [("auto_0_0", "CPU", 0), ("auto_0_1", "CPU", 0)]
    assert (
        "instance group gpu_each_0 of model gpu_each has kind KIND_GPU but no GPUs are available"
        in _reason(client, "gpu_each")
    )
    assert "the GPUs backend 'gpu_report' can use are: none" in _reason(client, "gpu_listed")
    assert client.is_model_ready("cpu")
    assert "Traceback" not in server.log


def test_a_backend_failing_to_count_gpus_fails_the_models_that_depend_on_them(
    coreserve_server: ServerFactory, http_client: ClientFactory, tmp_path: Path, gpu_report_backend_site: Path
) -> None:
    server = _start(coreserve_server, tmp_path, gpu_report_backend_site, "fail")
    client = http_client(server)
    reason = _reason(client, "auto")
    assert (
        "backend 'gpu_report' cannot tell which GPUs it can use: CUDA driver version is insufficient"
        in reason
    )
    # KIND_CPU groups do not depend on GPUs: the backend is not asked.
    assert client.is_model_ready("cpu")
    assert "Traceback" not in server.log
