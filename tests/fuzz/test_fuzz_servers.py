"""Fuzzing a real server process through its doors: raw HTTP over sockets, and gRPC.

The property at the wire: every answer to generated client input has a status below 500
(or 501, Triton's answer for an unsupported request), or the server closes the connection
cleanly; gRPC never answers UNKNOWN or INTERNAL; the server still answers /v2/health/ready
after each example; and its log holds no traceback.
"""

from __future__ import annotations

import gzip
import http.client
import json
import re
import socket
import struct
import zlib

import grpc
from hypothesis import example, given
from hypothesis import strategies as st

from coreserve.protos import grpc_service_pb2 as pb
from coreserve.protos import grpc_service_pb2_grpc as pb_grpc
from coreserve.testing import ServerProcess
from fuzz_support import edge_integers, model_infer_requests, near_valid_bodies

MODELS = ("simple", "simple_string", "text_classifier", "ensemble_pipeline", "no_such_model")
INFER_PATHS = [
    "/v2/models/simple/infer",
    "/v2/models/simple/versions/1/infer",
    "/v2/models/simple_string/infer",
]
PATHS = st.sampled_from(
    [
        *(f"/v2/models/{model}/infer" for model in MODELS),
        "/v2/models/simple/versions/1/infer",
        "/v2/models/simple/versions/x/infer",
        "/v2/models/simple/versions/%C2%B2/infer",
        "/v2/models/simple",
        "/v2/models/simple/config",
        "/v2/models/simple/ready",
        "/v2/models/simple/stats",
        "/v2/models/text_classifier/generate",
        "/v2/repository/index",
        "/v2/repository/models/simple/load",
        "/v2/repository/models/no_such_model/unload",
        "/v2",
        "/v2/health/live",
        "/v2/models/%2e%2e/infer",
        "/v2/models/simple/infer?x=1#y",
        "*",
        "",
    ]
) | st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40).map(lambda s: "/" + s)
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3})")


def _header_value() -> st.SearchStrategy[str]:
    return (
        st.sampled_from(["0", "1", "-1", "chunked", "gzip", "deflate", "identity", "100-continue", "close"])
        | (edge_integers.map(str))
        | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)
    )


def _chunked(body: bytes, sizes: list[int], lie: int) -> bytes:
    """`body` in chunked framing; `lie` is added to the first chunk's announced size."""
    out, start = [], 0
    for size in [*sizes, len(body)]:
        piece = body[start : start + size]
        if piece:
            out.append(b"%x\r\n%s\r\n" % (max(0, len(piece) + lie), piece))
            lie = 0
        start += size
    return b"".join(out) + b"0\r\n\r\n"


@st.composite
def simple_infer_bodies(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A valid infer body for the `simple` model (JSON or binary), so that answers get exercised too."""
    batch = draw(st.integers(1, 2))
    values = st.lists(st.integers(-1000, 1000), min_size=16 * batch, max_size=16 * batch)
    first, second = draw(values), draw(values)
    if draw(st.booleans()):
        inputs = [
            {"name": name, "datatype": "INT32", "shape": [batch, 16], "data": data}
            for name, data in (("INPUT0", first), ("INPUT1", second))
        ]
        return json.dumps({"inputs": inputs}).encode(), None
    chunks = [struct.pack(f"<{len(data)}i", *data) for data in (first, second)]
    inputs = [
        {
            "name": name,
            "datatype": "INT32",
            "shape": [batch, 16],
            "parameters": {"binary_data_size": len(chunk)},
        }
        for name, chunk in zip(("INPUT0", "INPUT1"), chunks, strict=True)
    ]
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    return header + b"".join(chunks), len(header)


@st.composite
def raw_http_requests(draw: st.DrawFn) -> bytes:
    """One HTTP/1.1 request, well formed or not: request line, headers, body and framing."""
    # A third of the requests are well framed infer calls, so that the answer path is fuzzed too;
    # the others mix every part at random.
    well_formed = draw(st.integers(0, 2)) == 0
    if well_formed:
        method, target, version = "POST", draw(st.sampled_from(INFER_PATHS)), "HTTP/1.1"
    else:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "POST ", "G\x00T"]))
        target = draw(PATHS)
        version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1 x", ""]))
    body, header_length = draw(
        near_valid_bodies() | simple_infer_bodies() | st.tuples(st.binary(max_size=64), st.none())
    )
    headers = [("Host", "127.0.0.1")]
    if header_length is not None:
        headers.append(("Inference-Header-Content-Length", str(header_length)))
    encoding = draw(
        st.sampled_from([None, None, "gzip", "deflate"] + ([] if well_formed else ["br", "gzip-cut"]))
    )
    if encoding == "gzip":
        body = gzip.compress(body)
    elif encoding == "gzip-cut":
        encoding = "gzip"
        body = gzip.compress(body)[: draw(st.sampled_from([-4, -8, 10]))] + draw(
            st.sampled_from([b"", b"junk"])
        )
    elif encoding == "deflate":
        body = zlib.compress(body)
    if encoding:
        headers.append(("Content-Encoding", encoding))
    framings = ["length", "chunked"] if well_formed else ["length", "chunked", "both", "none", "wrong_length"]
    framing = draw(st.sampled_from(framings))
    if framing in ("chunked", "both"):
        headers.append(("Transfer-Encoding", "chunked"))
        sizes = draw(st.lists(st.integers(1, 16), max_size=3))
        payload = _chunked(body, sizes, 0 if well_formed else draw(st.sampled_from([0, 0, 1, -1, 5])))
    else:
        payload = body
    if framing in ("length", "both"):
        headers.append(("Content-Length", str(len(body))))
    elif framing == "wrong_length":
        headers.append(("Content-Length", str(draw(edge_integers))))
    for _ in range(draw(st.integers(0, 1 if well_formed else 3))):
        name = draw(
            st.sampled_from(
                ["Content-Length", "Transfer-Encoding", "Content-Encoding", "Inference-Header-Content-Length",
                 "Expect", "Connection", "Accept-Encoding", "Content-Type", "X-\x7f", "", " Host"]
            )
        )  # fmt: skip
        headers.append((name, draw(_header_value())))
    head = f"{method} {target} {version}\r\n".replace(" \r\n", "\r\n")
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    # Sometimes a second, pipelined request follows (only the first answer is read).
    pipelined = draw(st.sampled_from([b"", b"", b"GET /v2/health/ready HTTP/1.1\r\n\r\n"]))
    return head.encode("latin-1", "replace") + b"\r\n" + payload + pipelined


def _first_status(address: tuple[str, int], data: bytes) -> int | None:
    """Sends `data` on a fresh connection; the status of the first answer, None if closed without one.

    When the server waits for more (a Content-Length that promises more than was sent), the
    client half-closes its side, as a client that gave up would, and reads what comes.
    """
    with socket.create_connection(address) as sock:
        sock.sendall(data)
        received = _read_head(sock, 0.5)
        if received is None:
            sock.shutdown(socket.SHUT_WR)
            received = _read_head(sock, 30)
            assert received is not None, "the server held a half-closed connection for 30 s"
    match = _STATUS_LINE.match(received)
    assert match or not received, f"not an HTTP answer: {received[:200]!r}"
    return int(match.group(1)) if match else None


def _read_head(sock: socket.socket, timeout: float) -> bytes | None:
    """The head of the first final answer (after any 100 Continue), what came before the
    connection closed, or None when nothing came within `timeout`."""
    sock.settimeout(timeout)
    received = b""
    while True:
        while received.startswith(b"HTTP/1.1 100") and b"\r\n\r\n" in received:
            received = received.split(b"\r\n\r\n", 1)[1]
        if b"\r\n\r\n" in received:
            return received
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return received or None
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def _assert_ready(server: ServerProcess) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.ports["HTTP"], timeout=30)
    try:
        connection.request("GET", "/v2/health/ready")
        assert connection.getresponse().status == 200
    finally:
        connection.close()


def _assert_no_traceback(server: ServerProcess) -> None:
    log = server.log
    assert "Traceback" not in log, log[-4000:]


def test_raw_http_requests_get_4xx_or_an_answer(fuzz_server: ServerProcess) -> None:
    address = ("127.0.0.1", fuzz_server.ports["HTTP"])

    @given(raw_http_requests())
    @example(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{]}\x00x")
    @example(
        b"GET /v2/health/ready HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n"
    )
    @example(
        b"POST /v2/models/simple/infer HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\n\x1f\x8b\x08\x00"
    )
    @example(b"GET /v2/models/simple/versions/%C2%B2 HTTP/1.1\r\n\r\n")  # int() refuses the digit '\u00b2'
    @example(b"POST /v2/repository/models/simple/load HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    @example(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a TLS hello
    def check(data: bytes) -> None:
        status = _first_status(address, data)
        # 501 is Triton's answer for what a server does not offer (an UNSUPPORTED error), and 503
        # its answer to the load API without --model-control-mode=explicit: documented, not faults.
        repository_api = data.startswith(b"POST /v2/repository/models/")
        assert status is None or status < 500 or status == 501 or (status == 503 and repository_api), (
            f"{status} for {data[:300]!r}"
        )
        _assert_ready(fuzz_server)

    check()
    _assert_no_traceback(fuzz_server)


def test_grpc_requests_never_get_unknown_or_internal(fuzz_server: ServerProcess) -> None:
    with grpc.insecure_channel(fuzz_server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        @given(model_infer_requests(model_names=MODELS))
        def check(message: pb.ModelInferRequest) -> None:
            try:
                stub.ModelInfer(message, timeout=60)
            except grpc.RpcError as exc:
                assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), exc.details()
                assert exc.details(), exc.code()

        check()
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
    _assert_no_traceback(fuzz_server)


def test_grpc_metadata_and_control_requests_never_get_unknown_or_internal(fuzz_server: ServerProcess) -> None:
    names = st.sampled_from(MODELS) | st.text(max_size=12)
    with grpc.insecure_channel(fuzz_server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        @given(
            st.one_of(
                st.builds(
                    lambda n, v: (stub.ModelMetadata, pb.ModelMetadataRequest(name=n, version=v)),
                    names,
                    st.text(max_size=4),
                ),
                st.builds(
                    lambda n, v: (stub.ModelConfig, pb.ModelConfigRequest(name=n, version=v)),
                    names,
                    st.text(max_size=4),
                ),
                st.builds(
                    lambda n, v: (stub.ModelReady, pb.ModelReadyRequest(name=n, version=v)),
                    names,
                    st.text(max_size=4),
                ),
                st.builds(lambda n: (stub.ModelStatistics, pb.ModelStatisticsRequest(name=n)), names),
                st.builds(
                    lambda n, config: (
                        stub.RepositoryModelLoad,
                        pb.RepositoryModelLoadRequest(
                            model_name=n,
                            parameters={"config": pb.ModelRepositoryParameter(string_param=config)},
                        ),
                    ),
                    names,
                    st.text(max_size=30) | st.just('{"input": 3}'),
                ),
            )
        )
        @example((stub.ModelMetadata, pb.ModelMetadataRequest(name="simple", version="\u00b2")))
        def check(call: tuple[object, object]) -> None:
            method, request = call
            try:
                method(request, timeout=60)  # type: ignore[operator]
            except grpc.RpcError as exc:
                assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), exc.details()

        check()
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
    _assert_no_traceback(fuzz_server)


def test_grpc_message_bytes_that_do_not_decode_get_invalid_argument(fuzz_server: ServerProcess) -> None:
    methods = ["ModelInfer", "ModelMetadata", "ModelConfig", "RepositoryModelLoad", "ServerReady"]
    with grpc.insecure_channel(fuzz_server.grpc_url) as channel:
        calls = {
            method: channel.unary_unary(f"/inference.GRPCInferenceService/{method}")  # bytes in, bytes out
            for method in methods
        }

        @given(st.sampled_from(methods), st.binary(max_size=64))
        @example("ModelInfer", b"\xff\xff\xff")  # grpc's own decoding gave UNKNOWN and a traceback per call
        @example("ModelInfer", b"\x2a\x03\x0a\x01")
        def check(method: str, data: bytes) -> None:
            try:
                calls[method](data, timeout=60)
            except grpc.RpcError as exc:
                assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), exc.details()

        check()
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        try:
            list(stream(iter([b"\xff\xff\xff"]), timeout=60))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
        else:
            raise AssertionError("a stream message that does not decode was accepted")
    _assert_ready(fuzz_server)
    _assert_no_traceback(fuzz_server)
