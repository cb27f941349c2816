"""The HTTP/1.1 layer itself, over raw sockets: keep-alive, pipelining, chunked and
100-continue bodies, large responses, malformed requests, HTTP/1.0."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from coreserve.testing import ServerProcess
from support.model_builders import identity_model, write_model

MAX_BODY = 8 * 1024 * 1024
IDENTITY = """
name: "identity"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository: Path = tmp_path_factory.mktemp("wire")
    write_model(repository, "identity", identity_model("FP32", [-1]), IDENTITY)
    process = ServerProcess([repository], [f"--http-max-input-size={MAX_BODY}"]).start()
    yield process
    process.close()


def _infer_body(values: list[float]) -> bytes:
    document = {"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32", "data": values}]}
    return json.dumps(document).encode()


def _post(path: str, body: bytes, extra: str = "", version: str = "1.1") -> bytes:
    return (
        f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body
    )


class Connection:
    """A raw client connection that reads whole responses (Content-Length or chunked)."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        self.buffer += chunk
        return bool(chunk)

    def _take_until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            if not self._fill():
                raise ConnectionError("closed")
        head, self.buffer = self.buffer.split(marker, 1)
        return head

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._fill():
                raise ConnectionError("closed")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def head(self) -> tuple[int, dict[str, str]]:
        """A response's status and headers, and nothing of a body (a HEAD request's answer)."""
        head = self._take_until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:])}
        return int(head[0].split()[1]), headers

    def response(self) -> tuple[int, dict[str, str], bytes]:
        status, headers = self.head()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(self._take_until(b"\r\n"), 16)
                body += self._take(size)
                self._take(2)
                if size == 0:
                    return status, headers, body
        return status, headers, self._take(int(headers.get("content-length", "0")))

    def closed_by_server(self) -> bool:
        return not self.buffer and not self._fill()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def connection(server: ServerProcess) -> Iterator[Connection]:
    client = Connection(server.http_url)
    yield client
    client.close()


def _outputs(body: bytes) -> list[float]:
    return json.loads(body)["outputs"][0]["data"]


def test_keep_alive_and_pipelined_requests_are_answered_in_order(connection: Connection) -> None:
    connection.send(b"".join(_post("/v2/models/identity/infer", _infer_body([float(n)])) for n in range(20)))
    for n in range(20):
        status, headers, body = connection.response()
        assert status == 200 and "connection" not in headers
        assert _outputs(body) == [float(n)]
    connection.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert connection.response()[0] == 200


def test_chunked_request_body(connection: Connection) -> None:
    body = _infer_body([1.5, 2.5])
    chunks = b"".join(
        b"%x\r\n%b\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, len(body), 7)
    )
    connection.send(
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunks
        + b"0\r\n\r\n"
    )
    status, _, reply = connection.response()
    assert status == 200 and _outputs(reply) == [1.5, 2.5]


def test_expect_100_continue(connection: Connection) -> None:
    body = _infer_body([3.0])
    head = _post("/v2/models/identity/infer", b"", "Expect: 100-continue\r\n").replace(
        b"Content-Length: 0", f"Content-Length: {len(body)}".encode()
    )
    connection.send(head)
    assert connection.response()[0] == 100
    connection.send(body)
    status, _, reply = connection.response()
    assert status == 200 and _outputs(reply) == [3.0]


def test_large_binary_response_arrives_whole(connection: Connection) -> None:
    data = np.arange(1 << 20, dtype=np.float32)  # 4 MiB each way
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [data.size],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    connection.send(
        _post(
            "/v2/models/identity/infer",
            header + data.tobytes(),
            f"Inference-Header-Content-Length: {len(header)}\r\n",
        )
    )
    status, headers, reply = connection.response()
    assert status == 200
    json_length = int(headers["inference-header-content-length"])
    np.testing.assert_array_equal(np.frombuffer(reply[json_length:], np.float32), data)


def test_body_over_the_limit_gets_413_and_the_connection_closes(connection: Connection) -> None:
    connection.send(_post("/v2/models/identity/infer", b" " * (MAX_BODY + 1)))
    status, headers, reply = connection.response()
    assert status == 413 and "too large" in json.loads(reply)["error"]
    assert headers.get("connection") == "close" and connection.closed_by_server()


@pytest.mark.parametrize(
    "garbage",
    [b"NOT HTTP AT ALL\r\n\r\n", b"POST /v2 HTTP/1.1\r\nContent-Length: x\r\n\r\n", b"GET / HTTP/9\r\n\r\n"],
)
def test_malformed_requests_get_400_and_others_keep_serving(server: ServerProcess, garbage: bytes) -> None:
    bad = Connection(server.http_url)
    try:
        bad.send(garbage)
        status, _, reply = bad.response()
        assert status == 400 and "malformed HTTP request" in json.loads(reply)["error"]
        assert bad.closed_by_server()
    finally:
        bad.close()
    good = Connection(server.http_url)
    try:
        good.send(_post("/v2/models/identity/infer", _infer_body([1.0])))
        assert good.response()[0] == 200
    finally:
        good.close()


def test_a_head_request_is_answered_without_a_body_and_the_connection_goes_on(connection: Connection) -> None:
    """No route serves HEAD (Triton answers it 405 too); the answer's Content-Length is the
    body's that a GET of the same resource would have, and no body follows."""
    connection.send(b"HEAD /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers = connection.head()
    assert (status, headers["allow"]) == (405, "GET")
    assert int(headers["content-length"]) == len(b'{"error":"Method Not Allowed"}')
    connection.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert connection.response()[0] == 200  # no body was left for this answer to be read from


def test_http_1_0_closes_after_the_response(connection: Connection) -> None:
    connection.send(_post("/v2/models/identity/infer", _infer_body([4.0]), version="1.0"))
    status, headers, reply = connection.response()
    assert status == 200 and _outputs(reply) == [4.0]
    assert headers.get("connection") == "close" and connection.closed_by_server()


def test_wrong_method_and_query_strings(connection: Connection) -> None:
    connection.send(b"GET /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, reply = connection.response()  # Triton's 405 and words, and HTTP's Allow
    assert (status, json.loads(reply), headers["allow"]) == (405, {"error": "Method Not Allowed"}, "POST")
    connection.send(b"POST /v2/health/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    status, headers, _ = connection.response()
    assert (status, headers["allow"]) == (405, "GET")
    connection.send(b"DELETE /v2/nothing/here HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, reply = connection.response()
    assert status == 404 and "unknown endpoint: DELETE /v2/nothing/here" in json.loads(reply)["error"]
    connection.send(b"GET /v2/models/identity/ready?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert connection.response()[0] == 200
