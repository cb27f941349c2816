"""Real `coreserve` processes on free loopback ports, and the `coreserve_server` fixture."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

_LISTENING = re.compile(r"Started (HTTP|GRPC|Metrics)(?:Inference)?Service at ([^\s:]+):(\d+)")
# The services a server starts unless told otherwise (--allow-grpc=false, say).
SERVICES = ("HTTP", "GRPC", "Metrics")


def _enabled_services(args: Sequence[str]) -> list[str]:
    flags = {"HTTP": "--allow-http", "GRPC": "--allow-grpc", "Metrics": "--allow-metrics"}
    turned_off = set()
    for index, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if not value and index + 1 < len(args):
            value = args[index + 1]
        for service, flag in flags.items():
            if name == flag and value.lower() in ("false", "0", "no", "off"):
                turned_off.add(service)
    return [service for service in SERVICES if service not in turned_off]


class ServerProcess:
    """A `coreserve` process on free ports of 127.0.0.1, with its log in a file."""

    def __init__(
        self,
        repositories: Sequence[str | Path],
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.args = [
            sys.executable,
            "-m",
            "coreserve",
            *(f"--model-repository={path}" for path in repositories),
            "--http-address=127.0.0.1",
            "--http-port=0",
            "--grpc-address=127.0.0.1",
            "--grpc-port=0",
            "--metrics-address=127.0.0.1",
            "--metrics-port=0",
            *extra_args,
        ]
        self.env = {**os.environ, **(env or {})}
        # With --log-file the server logs there, not to its standard error.
        self._log_file = next(
            (Path(arg.partition("=")[2]) for arg in extra_args if arg.startswith("--log-file=")), None
        )
        self.ports: dict[str, int] = {}
        self._log = tempfile.NamedTemporaryFile(prefix="coreserve-", suffix=".log", delete=False)  # noqa: SIM115
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> str:
        """What the server wrote to its standard output and error, then to its --log-file."""
        text = Path(self._log.name).read_text(errors="replace")
        if self._log_file is not None and self._log_file.is_file():
            text += self._log_file.read_text(errors="replace")
        return text

    @property
    def http_url(self) -> str:
        """host:port, as tritonclient.http takes it."""
        return f"127.0.0.1:{self.ports['HTTP']}"

    @property
    def grpc_url(self) -> str:
        """host:port, as tritonclient.grpc takes it."""
        return f"127.0.0.1:{self.ports['GRPC']}"

    @property
    def metrics_url(self) -> str:
        """The URL of the Prometheus endpoint."""
        return f"http://127.0.0.1:{self.ports['Metrics']}/metrics"

    def start(self, timeout: float = 60.0, wait_for: Sequence[str] | None = None) -> ServerProcess:
        """Starts the server and waits until the services listen (by default, those that
        the arguments do not turn off with --allow-<service>=false)."""
        if wait_for is None:
            wait_for = _enabled_services(self.args)
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for kind, _host, port in _LISTENING.findall(self.log):
                self.ports[kind] = int(port)
            if all(kind in self.ports for kind in wait_for):
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"coreserve exited with {self.process.returncode}:\n{self.log}")
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"coreserve did not start within {timeout}s:\n{self.log}")

    def wait(self, timeout: float = 60.0) -> int:
        """Waits for the process to exit by itself; returns its exit code."""
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """Sends SIGTERM and waits; kills the process if it does not exit in time."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def close(self) -> None:
        self.stop()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


ServerFactory = Callable[..., ServerProcess]


@pytest.fixture
def coreserve_server() -> Iterator[ServerFactory]:
    """Starts coreserve processes: `coreserve_server(repository, *extra_args, env=None)`."""
    started: list[ServerProcess] = []

    def start(
        repository: str | Path | Sequence[str | Path],
        *extra_args: str,
        env: dict[str, str] | None = None,
        wait_for: Sequence[str] | None = None,
    ) -> ServerProcess:
        repositories = [repository] if isinstance(repository, str | Path) else list(repository)
        server = ServerProcess(repositories, extra_args, env)
        started.append(server)
        return server.start(wait_for=wait_for)

    yield start
    for server in started:
        server.close()
