"""Fuzzing the system shared-memory extension of a real server over HTTP and gRPC.

Generated registrations (names, keys that are names, paths or junk, edge offsets and sizes,
bodies of any JSON shape), inferences whose tensors point into regions at edge offsets and
sizes, and unregistrations, against one real segment. The property: a client error (4xx, or
gRPC neither UNKNOWN nor INTERNAL) or an answer; the server stays ready (a mapping read past
a segment's end would kill it with SIGBUS) and logs no traceback.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import grpc
import pytest
import tritonclient.utils.shared_memory as shm
from hypothesis import example, given
from hypothesis import strategies as st

from coreserve.protos import grpc_service_pb2 as pb
from coreserve.protos import grpc_service_pb2_grpc as pb_grpc
from coreserve.testing import ServerProcess
from fuzz_support import edge_integers, json_values

SEGMENT_BYTES = 4096
NAMES = st.sampled_from(["r", "in", "out", "x" * 300]) | st.text(max_size=6)


@pytest.fixture(scope="module")
def segment_key() -> Iterator[str]:
    key = f"/coreserve-fuzz-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("fuzz", key, SEGMENT_BYTES)
    yield key
    shm.destroy_shared_memory_region(handle)


def _keys(segment_key: str) -> st.SearchStrategy[Any]:
    return (
        st.sampled_from(
            [
                segment_key,
                segment_key[1:],
                f"/..{segment_key}",
                "/etc/passwd",
                "../x",
                "/",
                "",
                "/no-such-segment",
            ]
        )
        | json_values
    )


@st.composite
def operations(draw: st.DrawFn, segment_key: str) -> list[tuple[str, str, Any]]:
    """(method, path, JSON body) steps: registrations, inferences and unregistrations, mixed."""
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(NAMES)
        kind = draw(st.sampled_from(["register", "register", "infer", "unregister"]))
        if kind == "register":
            body = draw(
                st.fixed_dictionaries(
                    {"key": _keys(segment_key)},
                    optional={
                        "offset": edge_integers | json_values,
                        "byte_size": edge_integers | json_values,
                    },
                )
                | json_values
            )
            steps.append(("POST", f"/v2/systemsharedmemory/region/{name}/register", body))
        elif kind == "infer":
            parameters = draw(
                st.fixed_dictionaries(
                    {"shared_memory_region": NAMES | json_values},
                    optional={
                        "shared_memory_offset": edge_integers | json_values,
                        "shared_memory_byte_size": edge_integers | json_values,
                    },
                )
            )
            inputs = [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": parameters},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16},
            ]
            outputs = [{"name": "OUTPUT0", "parameters": draw(st.just(parameters) | st.just({}))}]
            steps.append(("POST", "/v2/models/simple/infer", {"inputs": inputs, "outputs": outputs}))
        else:
            steps.append(("POST", f"/v2/systemsharedmemory/region/{name}/unregister", None))
    return steps


def _status(server: ServerProcess, method: str, path: str, body: Any) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", server.ports["HTTP"], timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, quote(path), body=data)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_shared_memory_requests_get_4xx_or_an_answer(fuzz_server: ServerProcess, segment_key: str) -> None:
    @given(operations(segment_key))
    @example(
        [
            ("POST", "/v2/systemsharedmemory/region/r/register", {"key": segment_key, "byte_size": 64}),
            (
                "POST",
                "/v2/models/simple/infer",
                {
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "datatype": "INT32",
                            "shape": [1, 16],
                            "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64},
                        },
                        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16},
                    ]
                },
            ),
        ]
    )
    def check(steps: list[tuple[str, str, Any]]) -> None:
        try:
            for method, path, body in steps:
                status = _status(fuzz_server, method, path, body)
                assert status < 500 or status == 501, f"{status} for {method} {path} {body!r}"[:500]
        finally:
            assert _status(fuzz_server, "POST", "/v2/systemsharedmemory/unregister", None) == 200
        assert _status(fuzz_server, "GET", "/v2/health/ready", None) == 200

    check()
    assert "Traceback" not in fuzz_server.log, fuzz_server.log[-4000:]


def test_grpc_shared_memory_control_never_gets_unknown_or_internal(
    fuzz_server: ServerProcess, segment_key: str
) -> None:
    with grpc.insecure_channel(fuzz_server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        @given(
            st.text(max_size=8),
            st.sampled_from([segment_key, "/etc/passwd", "../x", "", "/nope"]) | st.text(max_size=10),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
        )
        def check(name: str, key: str, offset: int, byte_size: int) -> None:
            try:
                stub.SystemSharedMemoryRegister(
                    pb.SystemSharedMemoryRegisterRequest(
                        name=name, key=key, offset=offset, byte_size=byte_size
                    ),
                    timeout=30,
                )
                stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name=name), timeout=30)
            except grpc.RpcError as exc:
                assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), exc.details()
                assert exc.details(), exc.code()
            finally:
                stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=30)

        check()
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
    assert "Traceback" not in fuzz_server.log, fuzz_server.log[-4000:]
