"""A tritonserver command line runs unchanged: Triton-only flags accepted, warned once, and acting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.model_builders import scale_model, write_model

SCALE = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


# Triton's console lines (not log entries) for its deprecated flag.
STRICT_DEPRECATED = "Warning: '--strict-model-config' has been deprecated! Please use '--disable-auto-complete-config' instead."
STRICT_OVERRIDDEN = (
    "Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
    "'--disable-auto-complete-config'!"
)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root, "scaled", scale_model(2.0), SCALE)
    write_model(root, "other", scale_model(3.0), SCALE)
    return root


def _scale(client: httpclient.InferenceServerClient, model: str = "scaled") -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0, 0])


def test_triton_only_flags_start_a_server_with_one_warning(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(
        repository,
        "--id=edge-triton",
        "--pinned-memory-pool-byte-size=268435456",
        "--cuda-memory-pool-byte-size",
        "0:67108864",
        "--backend-directory=/opt/tritonserver/backends",
        "--sagemaker-thread-count=8",
        "--rate-limit=off",
        "--allow-gpu-metrics=false",
        "--grpc-keepalive-time=60000",
        "--grpc-keepalive-permit-without-calls=1",
        "--grpc-infer-response-compression-level=high",
        "--strict-model-config=false",
    )
    warnings = [line for line in server.log.splitlines() if "tritonserver flags accepted and ignored" in line]
    assert len(warnings) == 1
    assert server.log.splitlines().count(STRICT_DEPRECATED) == 1 and STRICT_OVERRIDDEN not in server.log
    for name in (
        "--pinned-memory-pool-byte-size",
        "--cuda-memory-pool-byte-size",
        "--sagemaker-thread-count",
    ):
        assert warnings[0].count(name) == 1
    # (--backend-directory acts: where Python-based backends are found)
    for quiet in (
        "--rate-limit",
        "--allow-gpu-metrics",
        "--grpc-keepalive-time",
        "--id",
        "--backend-directory",
    ):
        assert f"{quiet} " not in warnings[0]
    with httpclient.InferenceServerClient(server.http_url) as client:
        metadata = client.get_server_metadata()
        assert metadata["name"] == "edge-triton" and "logging" in metadata["extensions"]
        assert _scale(client) == 2.0
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:  # responses compressed at the highest level still decode
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert float(grpc.infer("scaled", [tensor]).as_numpy("OUTPUT0")[0, 0]) == 2.0
        assert grpc.get_server_metadata().name == "edge-triton"
    finally:
        grpc.close()


def test_explicit_mode_without_load_model_loads_nothing(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit")
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert not client.is_model_ready("scaled") and not client.is_model_ready("other")
        client.load_model("other")
        assert _scale(client, "other") == 3.0


def test_explicit_mode_with_load_model_star_loads_everything(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(repository, "--model-control-mode=explicit", "--load-model=*")
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.is_model_ready("scaled") and client.is_model_ready("other")


def test_model_config_name_picks_the_named_configuration(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    configs = repository / "scaled" / "configs"
    configs.mkdir()
    (configs / "small.pbtxt").write_text(SCALE.replace("max_batch_size: 4", "max_batch_size: 2"))
    server = coreserve_server(repository, "--model-config-name=small")
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.get_model_config("scaled")["max_batch_size"] == 2
        assert client.get_model_config("other")["max_batch_size"] == 4  # no configs/small.pbtxt: config.pbtxt


def test_grpc_restricted_protocol_checks_tritons_header(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    server = coreserve_server(repository, "--grpc-restricted-protocol=statistics:admin-key=secret")
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            grpc.get_inference_statistics(
                "scaled", headers={"admin-key": "secret"}
            )  # HTTP's form: not enough
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert "triton-grpc-protocol-admin-key" in info.value.message()
        stats = grpc.get_inference_statistics("scaled", headers={"triton-grpc-protocol-admin-key": "secret"})
        assert stats.model_stats
    finally:
        grpc.close()


def test_an_unknown_flag_stops_the_start_with_a_suggestion(repository: Path) -> None:
    server = ServerProcess([repository], ["--model-namespace=true"])
    with pytest.raises(RuntimeError, match="exited with 2"):
        server.start()
    assert "did you mean --model-namespacing?" in server.log
    server.close()


def test_a_taken_grpc_port_stops_the_start_unless_both_reuse_it(
    coreserve_server: ServerFactory, repository: Path
) -> None:
    first = coreserve_server(repository, "--reuse-grpc-port=true")
    port = f"--grpc-port={first.ports['GRPC']}"
    second = ServerProcess([repository], [port])
    with pytest.raises(RuntimeError, match="exited with 1"):
        second.start()
    assert "failed to start gRPC service: Failed to bind" in second.log and "Traceback" not in second.log
    second.close()
    sharing = coreserve_server(repository, port, "--reuse-grpc-port=true")
    assert sharing.ports["GRPC"] == first.ports["GRPC"]


def test_strict_model_config_overridden_by_disable_auto_complete_config_says_so(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    (tmp_path / "empty").mkdir()
    server = coreserve_server(
        tmp_path / "empty", "--disable-auto-complete-config", "--strict-model-config=false"
    )
    lines = server.log.splitlines()
    assert lines.count(STRICT_DEPRECATED) == 1 and lines.count(STRICT_OVERRIDDEN) == 1
