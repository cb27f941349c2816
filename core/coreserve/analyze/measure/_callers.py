"""One inference request sent the way the user's clients send it: gRPC (ModelInfer) or HTTP
(the v2 REST endpoint with binary tensors, as tritonclient and perf_analyzer send them).

A caller raises ServerGone where the server cannot be reached, and RequestFailed where it
answered with an error: the first ends the sweep, the second is counted and reported.
"""

from __future__ import annotations

import json
from typing import Protocol

import aiohttp
import grpc

from coreserve.analyze.measure._client import ServerClient, ServerGone
from coreserve.protos import grpc_service_pb2 as pb

REQUEST_TIMEOUT_S = 60.0


class RequestFailed(Exception):
    """The server answered the request with an error."""


class Caller(Protocol):
    async def __call__(self) -> None: ...

    async def close(self) -> None: ...


class GrpcCaller:
    def __init__(self, client: ServerClient, request: pb.ModelInferRequest) -> None:
        self._client = client
        self._call = client.stub.ModelInfer
        self._request = request

    async def __call__(self) -> None:
        try:
            await self._call(self._request, timeout=REQUEST_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            await self._client.check_unavailable(exc)
            raise RequestFailed(exc.details() or str(exc.code())) from None

    async def close(self) -> None:
        return None  # the channel is the client's


class HttpCaller:
    """POST /v2/models/<model>/infer with the request's tensors as binary data, asking for
    binary outputs, on one pooled connection per client."""

    def __init__(self, address: str, request: pb.ModelInferRequest) -> None:
        self._address = address
        self._url = f"http://{address}/v2/models/{request.model_name}/infer"
        self._body, self._headers = _binary_body(request)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        )

    async def __call__(self) -> None:
        try:
            async with self._session.post(self._url, data=self._body, headers=self._headers) as reply:
                answer = await reply.read()
        except aiohttp.ClientConnectionError as exc:
            raise ServerGone(f"the server at {self._address} stopped answering: {exc}") from None
        except TimeoutError:
            raise RequestFailed(f"no answer within {REQUEST_TIMEOUT_S:g} s") from None
        if reply.status != 200:
            raise RequestFailed(_error_text(reply.status, answer))

    async def close(self) -> None:
        await self._session.close()


def _binary_body(request: pb.ModelInferRequest) -> tuple[bytes, dict[str, str]]:
    inputs = [
        {
            "name": tensor.name,
            "shape": list(tensor.shape),
            "datatype": tensor.datatype,
            "parameters": {"binary_data_size": len(raw)},
        }
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    ]
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return header + b"".join(request.raw_input_contents), headers


def _error_text(status: int, answer: bytes) -> str:
    try:
        return f"HTTP {status}: {json.loads(answer)['error']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {answer[:200].decode(errors='replace')}"
