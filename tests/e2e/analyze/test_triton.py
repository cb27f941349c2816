"""`coreserve analyze` beside the real Triton Inference Server 2.51 (`../shared/tools/real-tritonserver`,
CPU, python backend): the output model repository it writes loads and serves in Triton, and
`--server-url` measures a running Triton over Triton's own protocol and statistics.

The script is looked for in $REAL_TRITONSERVER, then as `shared/tools/real-tritonserver` beside
the checkout or a folder above it; where it is absent, or cannot install Triton, these tests skip.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.analyze._points import ModelSettings
from coreserve.config import read_config_file
from coreserve.config.json import config_from_dict
from coreserve.testing import ServerFactory
from support.paths import real_tritonserver
from support.waiting import wait_until

from .test_analyze import FAST, SMALL, analyze, checkpoint_lines, measured_settings, rows

REAL_TRITON_HOME = Path(os.environ.get("REAL_TRITON_HOME", Path.home() / ".cache" / "real-triton"))


REAL_TRITONSERVER = real_tritonserver()
pytestmark = pytest.mark.skipif(
    REAL_TRITONSERVER is None, reason="../shared/tools/real-tritonserver (the real Triton) is not here"
)
# The first start installs Triton (about a minute); later ones take seconds.
TRITON_READY_WITHIN_S = 600.0

MODEL = "addone"
CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
MODEL_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", data + 1)]))
        return responses
"""


@dataclass
class Triton:
    """A real tritonserver on free ports of 127.0.0.1, its log in a file."""

    process: subprocess.Popen[bytes]
    http_url: str
    grpc_url: str
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ready(triton: Triton) -> bool:
    with httpclient.InferenceServerClient(triton.http_url) as client:
        try:
            return bool(client.is_server_ready())
        except OSError:  # not listening yet
            return False


def _stop(triton: Triton) -> None:
    # The script stops its tritonserver on SIGTERM; the group is the script and its children.
    if triton.process.poll() is None:
        triton.process.terminate()
        try:
            triton.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(triton.process.pid, signal.SIGKILL)
            triton.process.wait()


@pytest.fixture
def real_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Path], Triton]]:
    """Starts the real Triton on a repository (every model loaded at start, Triton's default
    mode, and auto-completion off: each config.pbtxt must stand on its own) once it is ready."""
    started: list[Triton] = []

    def start(repository: Path) -> Triton:
        assert REAL_TRITONSERVER is not None
        http, grpc, metrics = _free_port(), _free_port(), _free_port()
        log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [str(REAL_TRITONSERVER), f"--model-repository={repository}", f"--http-port={http}",
                 f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--disable-auto-complete-config"],
                stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        triton = Triton(process, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", log)
        started.append(triton)
        wait_until(
            lambda: process.poll() is not None or _ready(triton),
            "the real Triton is ready",
            TRITON_READY_WITHIN_S,
            interval=0.2,
        )
        if process.poll() is not None:
            if not (REAL_TRITON_HOME / "venv" / "bin" / "python").is_file():
                pytest.skip(f"real-tritonserver could not install Triton:\n{triton.log_tail()}")
            pytest.fail(f"the real Triton exited with {process.returncode}:\n{triton.log_tail()}")
        return triton

    yield start
    for triton in started:
        _stop(triton)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    folder = tmp_path / "repository" / MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL_PY)
    return tmp_path / "repository"


def _serves_every_model(http_url: str, repository: Path) -> list[str]:
    """Every model folder of `repository` is READY under the settings its config.pbtxt names,
    and adds one to its input; returns their names."""
    names = sorted(folder.name for folder in repository.iterdir())
    with httpclient.InferenceServerClient(http_url) as client:
        index = client.get_model_repository_index()
        assert sorted((model["name"], model.get("state")) for model in index) == [
            (name, "READY") for name in names
        ]
        data = np.arange(4, dtype=np.float32).reshape(1, 4)  # a batch of 1: every max_batch_size takes it
        for name in names:
            written = ModelSettings.of(read_config_file(repository / name / "config.pbtxt"))
            assert ModelSettings.of(config_from_dict(client.get_model_config(name))) == written
            tensor = httpclient.InferInput("INPUT", [1, 4], "FP32")
            tensor.set_data_from_numpy(data)
            answer = client.infer(name, [tensor])
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT"), data + 1)
    return names


def test_the_output_repository_loads_and_serves_in_triton_and_in_coreserve(
    real_triton: Callable[[Path], Triton],
    coreserve_server: ServerFactory,
    repository: Path,
    tmp_path: Path,
) -> None:
    out_dir = tmp_path / "analysis"
    done = analyze(
        "--model-repository", repository, "--model", MODEL, "--search", "brute", "--output-dir", out_dir,
        *SMALL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    output = out_dir / "output_model_repository"
    best_three = [MODEL, f"{MODEL}_config_1", f"{MODEL}_config_2"]
    triton = real_triton(output)
    assert _serves_every_model(triton.http_url, output) == best_three
    assert "Traceback" not in triton.log_tail()
    assert _serves_every_model(coreserve_server(output).http_url, output) == best_three


def test_a_running_triton_is_measured_over_its_own_protocol_and_statistics(
    real_triton: Callable[[Path], Triton], repository: Path, tmp_path: Path
) -> None:
    triton = real_triton(repository)
    out_dir = tmp_path / "analysis"
    done = analyze(
        "--server-url", triton.grpc_url, "--model", MODEL, "--model-repository", repository,
        "--output-dir", out_dir, *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert len(measured_settings(out_dir)) == 1  # the model as Triton serves it; only the load swept
    table = rows(out_dir)
    assert table and {row["Max Batch Size"] for row in table} == {"4"}
    assert {row["Instance Group"] for row in table} == {"1:CPU"}
    assert all(float(row["Throughput (infer/sec)"]) > 0 and not row["Error"] for row in table)
    # The split comes from Triton's statistics extension: a python model spends time in execute.
    assert all(float(row["Server Compute Infer (ms)"]) > 0 for row in table)
    assert all(float(row["Server Queue (ms)"]) >= 0 for row in table)
    with httpclient.InferenceServerClient(triton.http_url) as client:
        stats = client.get_inference_statistics(MODEL)["model_stats"][0]["inference_stats"]
    # Triton counted every request the analysis measured (and its warm-ups besides).
    measured = sum(json.loads(line)["requests"] for line in checkpoint_lines(out_dir)[1:])
    assert int(stats["success"]["count"]) >= measured > 0
    # The output repository is written from Triton's own view of the model, and Triton loads it.
    output = out_dir / "output_model_repository"
    assert _serves_every_model(real_triton(output).http_url, output) == [MODEL]
