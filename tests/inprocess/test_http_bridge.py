"""The v2 REST API of an in-process server as a call (what Ray Serve's deployment answers with)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import tritonclient.http as httpclient

import coreserve


def _binary_infer_body() -> tuple[bytes, dict[str, str]]:
    """An add_sub request in the binary tensor extension, as tritonclient.http builds it."""
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4), binary_data=True)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs, request_id="b-1"
    )
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return body, headers


def test_the_bridge_answers_health_metadata_and_binary_inference(server: coreserve.Server) -> None:
    bridge = server.http_bridge()

    async def main() -> None:
        ready = await bridge.handle("GET", "/v2/health/ready", {}, b"")
        assert ready.status == 200
        metadata = await bridge.handle("GET", "/v2/models/add_sub?x=1", {}, b"")
        assert metadata.status == 200 and metadata.headers["content-type"] == "application/json"
        assert json.loads(metadata.body)["name"] == "add_sub"
        body, headers = _binary_infer_body()
        answer = await bridge.handle("POST", "/v2/models/add_sub/infer", headers, body)
        assert answer.status == 200
        length = {name.lower(): value for name, value in answer.headers.items()}[
            "inference-header-content-length"
        ]
        result = httpclient.InferResult.from_response_body(answer.body, header_length=int(length))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[0, 2, 4, 6]])
        assert result.get_response()["id"] == "b-1"
        missing = await bridge.handle("GET", "/v2/models/nope", {}, b"")
        assert missing.status == 404 and "nope" in json.loads(missing.body)["error"]

    asyncio.run(main())


def test_the_bridge_streams_generate_stream(server: coreserve.Server) -> None:
    bridge = server.http_bridge()

    async def main() -> list[int]:
        answer = await bridge.handle("POST", "/v2/models/countdown/generate_stream", {}, b'{"N": 3}')
        assert answer.status == 200 and answer.chunks is not None
        text = b"".join([chunk async for chunk in answer.chunks]).decode()
        return [json.loads(line[len("data: ") :])["VALUE"] for line in text.splitlines() if line]

    assert asyncio.run(main()) == [3, 2, 1]


def test_pending_requests_count_queued_and_running_ones(server: coreserve.Server) -> None:
    sleepy = server.model("sleepy")  # one instance, 0.5 s a request

    async def main() -> int:
        calls = [asyncio.ensure_future(sleepy.async_infer({"X": np.array([i], np.int32)})) for i in range(4)]
        deadline = time.monotonic() + 30
        seen = 0
        while time.monotonic() < deadline and seen < 4:
            seen = max(seen, await asyncio.to_thread(server.pending_requests))
            await asyncio.sleep(0.02)
        await asyncio.gather(*calls)
        return seen

    assert asyncio.run(main()) == 4
    assert server.pending_requests() == 0
