"""HTTP bodies to requests and responses to bodies: the HTTP frontend's codec, read top to bottom.

    body ─ read_body (decompressed) ─▶ decode_infer: raw, or JSON part + binary part
         ─▶ parse the JSON part ─▶ read the tensors ─▶ (InferenceRequest, OutputPlan)
    InferenceResponse + OutputPlan ─▶ encode_infer ─▶ body

Where each step runs is one rule (`off_loop`): work on at least `OFF_LOOP_BYTES` leaves the
event loop, so that one large request does not hold up the other connections; smaller work
stays on the loop, where a hop would cost more than the work. Parsing JSON holds the
interpreter lock throughout, so it leaves for a worker process (`JsonWorkers`); reading
tensors, decompressing and encoding mostly copy, and leave for a codec thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from coreserve.errors import (
    CancelledError,
    InvalidArgumentError,
    RequestMismatchError,
    UnsupportedError,
    with_request_id,
)
from coreserve.protocol.generate import decode_generate_request
from coreserve.protocol.http_body import (
    HEADER_LENGTH,
    complete_infer_request,
    decode_raw_infer_request,
    encode_infer_response,
    is_raw_request,
    parse_infer_document,
    split_infer_body,
)
from coreserve.protocol.output_plan import OutputPlan
from coreserve.server.dataplane import DataPlane
from coreserve.server.httpd import HttpRequest, UnsupportedEncoding, decompress
from coreserve.server.rest._codec_threads import CodecThreads
from coreserve.server.rest._json_workers import JsonWorkers
from coreserve.types import InferenceRequest, InferenceResponse

_T = TypeVar("_T")
_HEADER_LENGTH_KEY = HEADER_LENGTH.lower()
OFF_LOOP_BYTES = 1 << 20
# Compressed bodies can inflate a thousandfold, so they leave the loop from a smaller size.
OFF_LOOP_COMPRESSED_BYTES = 16 << 10


def off_loop(size: int, compressed: bool = False) -> bool:
    """Whether work on `size` bytes leaves the event loop (see the module's docstring)."""
    return size >= (OFF_LOOP_COMPRESSED_BYTES if compressed else OFF_LOOP_BYTES)


class BodyCodec:
    """Decodes the HTTP frontend's request bodies and encodes its responses, each step on the
    loop or off it as `off_loop` says."""

    def __init__(self, dataplane: DataPlane, max_body_size: int) -> None:
        self._dataplane = dataplane
        self._max_body_size = max_body_size
        self._threads = CodecThreads("coreserve-http-codec")
        self._json_workers = JsonWorkers()

    @property
    def json_workers(self) -> JsonWorkers:
        return self._json_workers

    def close(self) -> None:
        self._threads.close()
        self._json_workers.close()

    async def read_body(self, request: HttpRequest) -> bytes | bytearray:
        """The body, decompressed under its Content-Encoding."""
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        body = request.body
        if encoding == "identity" or not body:
            return body
        try:
            return await self._run(
                off_loop(len(body), compressed=True), decompress, body, encoding, self._max_body_size
            )
        except UnsupportedEncoding:  # (Triton's status and words)
            raise UnsupportedError("Unsupported compression type") from None
        except ValueError as exc:
            raise InvalidArgumentError(f"cannot read the request body: {exc}") from None

    async def decode_infer(
        self, request: HttpRequest, model: str, version: str
    ) -> tuple[InferenceRequest, OutputPlan]:
        """An infer request's body as the request and its output plan. The body is let go once
        decoded (inputs that view it keep it alive themselves): tens of megabytes fewer held at
        the peak of a large request."""
        body = await self.read_body(request)
        header = request.headers.get(_HEADER_LENGTH_KEY)
        header_length = _header_length(header) if header is not None else None
        request.body = b""
        if is_raw_request(body, header_length):
            return await self._decode_raw(body, model, version)
        json_part, binary = split_infer_body(body, header_length)
        if off_loop(len(json_part)):
            parsing = self._json_workers.parse_infer(json_part, len(binary), model)
            document = await _unless_disconnected(request, model, parsing)
        else:
            document = parse_infer_document(json_part, len(binary), model)
        regions = self._dataplane.shared_memory
        return await self._run(
            off_loop(len(binary)), complete_infer_request, document, binary, model, version, regions
        )

    async def _decode_raw(
        self, body: bytes | bytearray, model: str, version: str
    ) -> tuple[InferenceRequest, OutputPlan]:
        """A raw request (`is_raw_request`): the body is wrapped as the data of the model's one
        input, not parsed (cheap at any size)."""
        target = await self._dataplane.serving_version(model, version)
        inputs = list(target.signature.inputs.values())
        if len(inputs) != 1:
            raise RequestMismatchError(
                with_request_id(
                    "",
                    f"Raw request must only have 1 input (found 1) to be deduced but got {len(inputs)} "
                    f"inputs in '{model}' model configuration",
                )
            )
        return decode_raw_infer_request(body, inputs[0], target.signature.batching, model, version)

    async def decode_generate(self, request: HttpRequest, model: str, version: str) -> InferenceRequest:
        """A generate request's body (a JSON object of input values) as the request."""
        target = await self._dataplane.serving_version(model, version)
        body = await self.read_body(request)
        signature = target.signature
        if not off_loop(len(body)):
            return decode_generate_request(body, signature, model, version)
        parsing = self._json_workers.parse_generate(body, signature.inputs, signature.batching)
        return (await _unless_disconnected(request, model, parsing)).request(model, version)

    async def encode_infer(
        self, response: InferenceResponse, plan: OutputPlan
    ) -> tuple[bytes | bytearray, int | None]:
        """The response's body, and its JSON part's length when binary data follows."""
        size = sum(array.nbytes for array in response.outputs.values())  # BYTES: pointers only
        return await self._run(off_loop(size), encode_infer_response, response, plan)

    async def _run(self, elsewhere: bool, function: Callable[..., _T], *args: Any) -> _T:
        return await self._threads.run(function, *args) if elsewhere else function(*args)


async def _unless_disconnected(request: HttpRequest, model: str, work: Awaitable[_T]) -> _T:
    """Awaits `work`, which stops (cancelled) if the client of `request` disconnects meanwhile."""
    task = asyncio.ensure_future(work)
    if request.disconnected:
        task.cancel()
    else:
        request.on_disconnect = task.cancel
    try:
        return await task
    except asyncio.CancelledError:
        if task.cancelled() and request.disconnected:
            raise CancelledError.of_request(model) from None
        raise
    finally:
        request.on_disconnect = None


def _header_length(value: str) -> int:
    try:
        length = int(value)
    except ValueError:
        raise InvalidArgumentError(f"{HEADER_LENGTH} must be an integer, got '{value}'") from None
    if length < 0:
        raise InvalidArgumentError(f"{HEADER_LENGTH} must be >= 0, got {length}")
    return length
