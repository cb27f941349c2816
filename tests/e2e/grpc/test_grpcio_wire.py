"""The grpcio transport (`--grpc-server grpcio`) against a rapid-reset flood, in raw HTTP/2 frames.

grpc's core does the HTTP/2 here; what coreserve decides is which of its limits to set (see
server/grpc/_transport.py). A client that opens and resets streams as fast as it can (CVE-2023-44487)
must get its streams refused past the per-connection limit, while another client's calls of the
same method keep getting their answers (without the limit, gRPC core cancels them at random).
benchmarks/attacks/http2_attacks.py measures the same attacks for longer, with latencies.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from coreserve.protos import grpc_service_pb2 as pb
from coreserve.server.grpc._transport import DEFAULT_MAX_CONCURRENT_STREAMS
from coreserve.testing import ServerProcess
from support.model_builders import identity_model, write_model
from support.waiting import wait_until

IDENTITY = """
backend: "onnxruntime"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS = 0, 1, 3, 4
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
MAX_CONCURRENT_STREAMS, CANCEL, REFUSED_STREAM = 0x3, 0x8, 0x7


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("grpcio-wire")
    write_model(repository, "identity", identity_model("FP32", ["n"]), IDENTITY)
    process = ServerProcess([repository], ["--grpc-server=grpcio", "--allow-metrics=false"]).start()
    yield process
    assert "Traceback" not in process.log, process.log[-3000:]
    process.close()


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream_id) + payload


class Attacker:
    """A raw connection whose reader thread acknowledges SETTINGS and counts what comes back."""

    def __init__(self, server: ServerProcess) -> None:
        host, port = server.grpc_url.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self.settings: dict[int, int] = {}
        self.resets: Counter[int] = Counter()
        self.settings_read = threading.Event()
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def send(self, data: bytes) -> None:
        with self.lock:
            self.sock.sendall(data)

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                length, kind, flags = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[4]
                payload, buffer = buffer[9 : 9 + length], buffer[9 + length :]
                if kind == SETTINGS and not flags & ACK:
                    for index in range(0, length, 6):
                        key, value = struct.unpack(">HI", payload[index : index + 6])
                        self.settings[key] = value
                    self.send(frame(SETTINGS, ACK, 0))
                    self.settings_read.set()
                elif kind == RST_STREAM:
                    self.resets[int.from_bytes(payload, "big")] += 1

    def close(self) -> None:
        self.sock.close()
        self.reader.join(10)


@pytest.fixture
def attacker(server: ServerProcess) -> Iterator[Attacker]:
    connection = Attacker(server)
    yield connection
    connection.close()


def infer_call(values: int) -> tuple[list[tuple[str, str]], bytes]:
    """The header fields and the DATA payload of one ModelInfer call to the identity model."""
    request = pb.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[values])
    request.raw_input_contents.append(np.arange(values, dtype=np.float32).tobytes())
    body = request.SerializeToString()
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/inference.GRPCInferenceService/ModelInfer"),
        (":authority", "attacker"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    return fields, struct.pack(">BI", 0, len(body)) + body


def test_grpcio_announces_its_stream_limit(attacker: Attacker) -> None:
    assert attacker.settings_read.wait(10)
    assert attacker.settings.get(MAX_CONCURRENT_STREAMS) == DEFAULT_MAX_CONCURRENT_STREAMS


def test_a_rapid_reset_flood_is_refused_while_another_client_gets_its_answers(
    server: ServerProcess, attacker: Attacker
) -> None:
    assert attacker.settings_read.wait(10)
    fields, body = infer_call(4)
    encoder = hpack.Encoder()
    answers: list[np.ndarray] = []
    flooding = threading.Event()

    def flood() -> None:
        stream = 1
        for _ in range(40):  # 40 writes of 200 streams, each opened, sent and reset at once
            writes = bytearray()
            for _ in range(200):
                writes += frame(HEADERS, END_HEADERS, stream, encoder.encode(fields))
                writes += frame(DATA, END_STREAM, stream, body)
                writes += frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL))
                stream += 2
            attacker.send(bytes(writes))
            flooding.set()

    flooder = threading.Thread(target=flood)
    flooder.start()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert flooding.wait(30)
        data = np.arange(8, dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [8], "FP32")
        tensor.set_data_from_numpy(data)
        while flooder.is_alive() or len(answers) < 20:
            answers.append(client.infer("identity", [tensor], client_timeout=30).as_numpy("OUTPUT0"))
    finally:
        flooder.join(60)
        client.close()
    for answer in answers:  # none CANCELLED (infer raises), each right
        np.testing.assert_array_equal(answer, data)
    # The last refusals may still be on their way.
    wait_until(lambda: attacker.resets[REFUSED_STREAM] > 0, "a stream refused with REFUSED_STREAM")
