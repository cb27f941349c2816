"""ONNX Runtime's own telemetry stays off, as it is in Triton's ONNX Runtime backend (built
without it): a server that loads and runs an ONNX model writes no device id or event store in
its home folder and no session file in its temp folder (recent onnxruntime wheels write all
three on Linux, and send what they record)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from coreserve.testing import ServerFactory
from support.model_builders import ADD_SUB_CONFIG, add_sub_model, write_model


def test_a_server_running_an_onnx_model_leaves_no_telemetry_files(
    tmp_path: Path, short_temp: Path, coreserve_server: ServerFactory
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    write_model(tmp_path / "models", "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    server = coreserve_server(tmp_path / "models", env={"HOME": str(home), "TMPDIR": str(short_temp)})
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput(name, [1, 4], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert client.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
    server.close()
    assert list(home.rglob("*")) == []
    assert list(short_temp.iterdir()) == []
