"""The replica class itself, in this process (no Ray cluster): health, autoscaling metric, answers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from starlette.requests import Request

from coreserve.ray import PENDING_REQUESTS, REPLICA_HEADER, CoreserveReplica
from support.model_builders import scale_model, write_model

SCALE = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _request(method: str, path: str, body: bytes = b"") -> Request:
    """A Starlette request as Ray Serve's proxy hands it to a replica."""
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    return Request(scope, receive)


def test_a_replica_is_healthy_only_while_every_model_is_ready(tmp_path: Path) -> None:
    write_model(tmp_path, "scale", scale_model(2.0), SCALE)
    write_model(tmp_path, "broken", b"not an onnx model", SCALE)
    replica = CoreserveReplica(str(tmp_path), {"exit_on_error": False})
    try:
        with pytest.raises(RuntimeError, match=r"not ready.*broken"):
            replica.check_health()
        assert replica.record_autoscaling_stats() == {PENDING_REQUESTS: 0.0}
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        answer = asyncio.run(replica(_request("POST", "/v2/models/scale/infer", json.dumps(body).encode())))
        assert answer.status_code == 200
        assert answer.headers[REPLICA_HEADER] == replica.identity
        assert json.loads(answer.body)["outputs"][0]["data"] == [2, 4, 6, 8]
    finally:
        replica.__del__()
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(scale_model(3.0).SerializeToString())
    healthy = CoreserveReplica(str(tmp_path))
    try:
        healthy.check_health()
    finally:
        healthy.__del__()
