"""coreserve started with exactly a manifest's container arguments and environment serves the
example repository, every probe the manifest declares answers on the port it names, the metric
the autoscaler reads is exported where Prometheus is told to scrape, and the image's health
check follows the server's readiness."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from deploy_render import IMAGE_RECIPE, TREES, flag_values, one, render, server_container
from dockerfile_reader import stages

from coreserve.protos import health_pb2, health_pb2_grpc
from coreserve.testing import ServerProcess
from support.paths import EXAMPLES

# The gpu overlay's container has the cpu overlay's arguments and environment
# (test_deploy_manifests checks it), so one run stands for both.
CONTAINERS = ("cpu", "kserve")
# The only flags replaced to run here: the model repository (a volume in the pod; the example
# repository here) and the ports (8000-8002 and 8080 may be taken on a shared machine, so
# ServerProcess binds free ports of 127.0.0.1 and the probes are sent where those landed).
_PORT_FLAGS = {"--http-port": "HTTP", "--grpc-port": "GRPC", "--metrics-port": "Metrics"}
_REPLACED = {"--model-repository", *_PORT_FLAGS}


@dataclass
class ServedManifest:
    """A server started as a manifest's container says, and where its container ports landed."""

    container: dict[str, Any]
    server: ServerProcess
    ports: dict[int, int]  # container port → the port bound here

    def local_port(self, probe_port: int | str) -> int:
        """The port here for a probe's port (a number, or the name of a container port)."""
        if isinstance(probe_port, str):
            named = {
                port["name"]: port["containerPort"] for port in self.container["ports"] if "name" in port
            }
            probe_port = named[probe_port]
        return self.ports[probe_port]

    def flag_port(self, flag: str) -> int:
        """The port here for the container port a flag (--http-port …) names."""
        return self.ports[int(flag_values(self.container["args"])[flag])]


def start_as_manifest(container: dict[str, Any], repository: Path = EXAMPLES) -> ServedManifest:
    """Starts coreserve with the container's arguments and environment (repository and ports aside)."""
    flags = flag_values(container["args"])
    kept = [arg for arg in container["args"] if arg.partition("=")[0] not in _REPLACED]
    env = {}
    for variable in container.get("env", []):
        assert set(variable) == {"name", "value"}, f"only plain values can be reproduced here: {variable}"
        env[variable["name"]] = variable["value"]
    server = ServerProcess([repository], kept, env).start(timeout=120)
    ports = {int(flags[flag]): server.ports[service] for flag, service in _PORT_FLAGS.items()}
    return ServedManifest(container, server, ports)


@pytest.fixture(scope="module", params=CONTAINERS)
def served(request: pytest.FixtureRequest) -> Iterator[ServedManifest]:
    running = start_as_manifest(server_container(render(TREES[request.param])))
    yield running
    running.server.close()


def test_every_probe_answers(served: ServedManifest) -> None:
    probes = {key: value for key, value in served.container.items() if key.endswith("Probe")}
    assert {"readinessProbe", "livenessProbe", "startupProbe"} <= probes.keys()
    for kind, probe in probes.items():
        if "httpGet" in probe:
            action = probe["httpGet"]
            url = f"http://127.0.0.1:{served.local_port(action['port'])}{action['path']}"
            with urllib.request.urlopen(url, timeout=10) as answer:
                assert answer.status == 200, f"{kind}: {url}"
        else:
            action = probe["grpc"]
            assert set(action) <= {"port", "service"}, f"{kind}: {action}"
            with grpc.insecure_channel(f"127.0.0.1:{served.local_port(action['port'])}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                answer = stub.Check(
                    health_pb2.HealthCheckRequest(service=action.get("service", "")), timeout=10
                )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, kind


def test_the_examples_answer_over_http_and_grpc(served: ServedManifest) -> None:
    http_port, grpc_port = served.flag_port("--http-port"), served.flag_port("--grpc-port")
    first = np.arange(16, dtype=np.int32).reshape(1, 16)
    second = np.full((1, 16), 3, dtype=np.int32)
    for module, port in ((httpclient, http_port), (grpcclient, grpc_port)):
        client: Any = module.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(first)
            inputs[1].set_data_from_numpy(second)
            result = client.infer("simple", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), first + second)
            assert client.is_model_ready("ensemble_pipeline")
        finally:
            client.close()


def test_the_autoscaling_metric_is_where_prometheus_scrapes(served: ServedManifest) -> None:
    metrics_port = served.flag_port("--metrics-port")
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    hpa = one(render(TREES["cpu"]), "HorizontalPodAutoscaler")
    name = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert f'{name}{{model="simple",version="1"}} 0' in text.splitlines()


def test_sigterm_ends_the_server_within_the_grace_period() -> None:
    objects = render(TREES["cpu"])
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    running = start_as_manifest(server_container(objects))
    try:
        # The grace period is the deadline, as the kubelet's SIGKILL would be: stop() fails
        # if the server has not exited by then; it exits 0, having stopped on its own.
        assert running.server.stop(timeout=pod["terminationGracePeriodSeconds"]) == 0
        assert "coreserve stopped" in running.server.log
    finally:
        running.server.close()


def test_the_image_health_check_passes_on_a_ready_server(served: ServedManifest) -> None:
    result = _run_health_check(served.flag_port("--http-port"))
    assert result.returncode == 0, result.stderr


def test_probes_and_the_health_check_fail_while_a_model_is_not_ready(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "broken"\nbackend: "no_such_backend"\n')
    container = server_container(render(TREES["cpu"]))
    # As the manifest, except that a model failing to load leaves the server up, not ready.
    container["args"] = [*container["args"], "--exit-on-error=false"]
    running = start_as_manifest(container, repository=tmp_path)
    try:
        http_port = running.flag_port("--http-port")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=10)
        refused.value.close()
        assert refused.value.code >= 400
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/live", timeout=10) as answer:
            assert answer.status == 200  # alive: the kubelet must not restart it for a model
        with grpc.insecure_channel(f"127.0.0.1:{running.flag_port('--grpc-port')}") as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert _run_health_check(http_port).returncode == 1
    finally:
        running.server.close()


def _run_health_check(http_port: int) -> subprocess.CompletedProcess[str]:
    """Runs the image's HEALTHCHECK command with this interpreter, against `http_port`."""
    [check] = [
        instruction for instruction in stages(IMAGE_RECIPE)[-1] if instruction.keyword == "HEALTHCHECK"
    ]
    command_text = check.arguments.partition(" CMD ")[2]
    command = json.loads(command_text)
    assert command[0] == "python"
    code = [word.replace("127.0.0.1:8000", f"127.0.0.1:{http_port}") for word in command[1:]]
    return subprocess.run([sys.executable, *code], capture_output=True, text=True, timeout=30)
