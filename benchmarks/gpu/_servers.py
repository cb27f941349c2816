"""The servers the run measures: coreserve (coreserve.testing's process) and the real Triton
2.51, started from the pack's trimmed copy of the nvidia-pytriton 0.7.0 wheel or from the
install of shared/tools/real-tritonserver; their statistics and metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.support.models import start_server
from benchmarks.transports.overhead import free_port
from coreserve.testing import ServerProcess

# The folder holding pytriton/tritonserver/ and nvidia_pytriton.libs/: the unpacked pack on
# the device (device-run.sh sets it), else shared/tools/real-tritonserver's venv.
TRITON_ROOT_VARIABLE = "GPU_TRITON_ROOT"


def triton_root() -> Path | None:
    """Where the real Triton's files are, or None where it is not installed."""
    named = os.environ.get(TRITON_ROOT_VARIABLE)
    home = Path(os.environ.get("REAL_TRITON_HOME") or Path.home() / ".cache" / "real-triton")
    candidates = [Path(named)] if named else sorted((home / "venv" / "lib").glob("python3*/site-packages"))
    for root in candidates:
        if (root / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file():
            return root
    return None


def _libpython_folder() -> str | None:
    """The folder of this Python's shared library, which Triton's stub links against."""
    name = f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    folders = [os.environ.get("GPU_LIBPYTHON_DIR"), sysconfig.get_config_var("LIBDIR"),
               f"{sys.base_prefix}/lib", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib", "/usr/lib"]  # fmt: skip
    return next((folder for folder in folders if folder and Path(folder, name).exists()), None)


def wait_ready(http_url: str, models: list[str], timeout: float = 180, process: Any = None) -> None:
    """Waits until the server and each of `models` answer ready."""
    deadline = time.monotonic() + timeout
    for path in ["/v2/health/ready", *(f"/v2/models/{model}/ready" for model in models)]:
        while True:
            try:
                with urllib.request.urlopen(f"http://{http_url}{path}", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode} before {path} was ready")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} was not ready within {timeout:g} s")
            time.sleep(0.2)


def coreserve(repository: Path, models: list[str], *args: str, timeout: float = 180) -> ServerProcess:
    return _ready(start_server(repository, *args), models, timeout, "coreserve")


class TritonProcess:
    """The real Triton on free loopback ports, serving a copy of a repository in which each
    model.py first puts this process's import path on sys.path (its stub runs Python isolated)."""

    def __init__(self, root: Path, repository: Path, extra: list[str]) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="gpu-triton-"))
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        server = root / "pytriton" / "tritonserver"
        backends = self.work / "backends" / "python"
        backends.mkdir(parents=True)
        stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise RuntimeError(f"the real Triton at {root} has no Python {version} stub")
        for source in (server / "backends/python/libtriton_python.so", server / "backends/python/triton_python_backend_utils.py", stub):  # fmt: skip
            shutil.copy2(source, backends / source.name)
        copy = self.work / "models"
        shutil.copytree(repository, copy)
        # Triton 2.51's stub mis-sizes tensors under numpy 2 (JSON answers fail): a numpy 1 goes
        # first, the pack's (stub-site/3.X/) or the one beside the server in real-tritonserver's venv.
        numpy1 = [str(p) for p in (root / "stub-site" / version, root) if (p / "numpy").is_dir()]
        paths = numpy1 + [entry for entry in sys.path if entry and Path(entry).is_dir()]
        prefix = f"import sys as _s\n_s.path[:0] = [p for p in {paths!r} if p not in _s.path]\n"
        for model_py in copy.rglob("model.py"):
            model_py.write_text(prefix + model_py.read_text())
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        libraries = [
            str(root / "nvidia_pytriton.libs"),
            _libpython_folder(),
            os.environ.get("LD_LIBRARY_PATH"),
        ]
        env = {**os.environ, "LD_LIBRARY_PATH": ":".join(p for p in libraries if p),
               "PYTHONPATH": os.pathsep.join(paths)}  # fmt: skip
        self.log_path = self.work / "triton.log"
        command = [
            str(server / "bin" / "tritonserver"), f"--model-repository={copy}",
            f"--backend-directory={self.work / 'backends'}", "--allow-gpu-metrics=false", "--log-verbose=0",
            "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
            f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
            *extra,
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def triton(repository: Path, models: list[str], *extra: str, timeout: float = 180) -> TritonProcess:
    """The real Triton serving `repository`, ready; raises where it is not installed."""
    root = triton_root()
    if root is None:
        raise RuntimeError(f"the real Triton is not installed (set ${TRITON_ROOT_VARIABLE})")
    return _ready(TritonProcess(root, repository, list(extra)), models, timeout, "the real Triton")


_Server = TypeVar("_Server", ServerProcess, TritonProcess)


def _ready(server: _Server, models: list[str], timeout: float, who: str) -> _Server:
    """`server` once it serves `models`; closed, and the error with its log's end, where it does not."""
    try:
        wait_ready(server.http_url, models, timeout, server.process)
    except Exception as exc:
        log = server.log[-3000:]
        server.close()
        raise RuntimeError(f"{who}: {exc}\n{log}") from exc
    return server


def batch_counts(http_url: str, model: str) -> dict[int, int]:
    """How many executions the batcher formed of each size so far (the model's batch_stats)."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats", timeout=10) as answer:
        stats = json.load(answer)["model_stats"][0]
    return {
        int(entry["batch_size"]): int(entry["compute_infer"]["count"])
        for entry in stats.get("batch_stats", [])
    }


def metric_values(metrics_url: str, families: tuple[str, ...]) -> dict[str, float]:
    """The sum over labels of each family's samples in a Prometheus text answer (absent: left out)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in families:
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values
