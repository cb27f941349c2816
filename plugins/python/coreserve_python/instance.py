"""One instance of a Python model: a stub process that the server feeds with batches."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from coreserve import (
    AlreadyExistsError,
    CancelledError,
    CoreserveError,
    InferenceRequest,
    InternalError,
    InvalidArgumentError,
    ModelConfig,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
    config_to_dict,
)
from coreserve.backend import InstancePlacement, ModelFiles, Responder, ServerContext
from coreserve_python.process import StubLaunch, StubProcess
from coreserve_python.wire import Message, SegmentPool, SegmentReader

logger = logging.getLogger("coreserve.backend.python")
# pb_utils.TritonError codes -> coreserve errors.
ERRORS: dict[int, type[CoreserveError]] = {
    0: InternalError,
    1: InternalError,
    2: NotFoundError,
    3: InvalidArgumentError,
    4: UnavailableError,
    5: UnsupportedError,
    6: AlreadyExistsError,
    7: CancelledError,
}
CODES = {
    InvalidArgumentError: 3,
    NotFoundError: 2,
    UnavailableError: 4,
    UnsupportedError: 5,
    AlreadyExistsError: 6,
    CancelledError: 7,
}
LOG_LEVELS = {
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "VERBOSE": logging.DEBUG,
}
SEQUENCE_START, SEQUENCE_END = 1, 2


class PythonInstance:
    """Runs batches in a stub process; restarts the stub if it dies."""

    def __init__(
        self,
        launch: StubLaunch,
        model: ModelFiles,
        config: ModelConfig,
        placement: InstancePlacement,
        server: ServerContext,
    ) -> None:
        self._launch = launch
        self._model = model
        self._config = config
        self._placement = placement
        self._server = server
        self._decoupled = config.model_transaction_policy.decoupled
        self.name = f"model '{model.name}' instance {placement.name}"
        self._pool = SegmentPool(placement.name)
        self._reader = SegmentReader()
        self._open: dict[int, tuple[InferenceRequest, Responder]] = {}
        self._next_key = 0
        self._process: StubProcess | None = None
        self._restart: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def _args(self) -> dict[str, str]:
        return {
            "model_config": json.dumps(config_to_dict(self._config)),
            "model_instance_kind": self._placement.kind.value,
            "model_instance_name": self._placement.name,
            "model_instance_device_id": str(self._placement.device_id),
            "model_repository": str(self._model.path),
            "model_version": str(self._model.version),
            "model_name": self._model.name,
        }

    async def start(self) -> None:
        """Starts the stub and runs the model's initialize(); raises with its traceback if it fails."""
        process = StubProcess(self._launch, self.name, self._on_message, self._on_exit)
        await process.start()
        message = {
            "op": "init",
            "model_file": str(self._model.model_file),
            "args": self._args(),
            "decoupled": self._decoupled,
        }
        try:
            reply = await process.request(message, "init_done")
        except CoreserveError:
            await process.stop(timeout=5)
            raise
        if reply["error"] is not None:
            await process.stop(timeout=5)
            raise UnavailableError(f"{self.name}: initialize() failed:\n{reply['error']}")
        self._process = process

    def _on_exit(self, code: int | None) -> None:
        error = InternalError(
            f"the Python stub of {self.name} exited unexpectedly (code {code}) while serving; "
            "in-flight requests failed and the stub is being restarted"
        )
        logger.error("%s", error.message)
        for request, responder in list(self._open.values()):
            responder.send_error(request, error)
        self._open.clear()
        self._process = None
        if not self._closed:
            self._restart = asyncio.create_task(self._start_again())

    async def _start_again(self) -> None:
        try:
            await self.start()
            logger.info("%s: the stub was restarted", self.name)
        except CoreserveError as exc:
            logger.error("%s: restarting the stub failed: %s", self.name, exc.message)

    async def _running(self) -> StubProcess:
        if self._restart is not None and not self._restart.done():
            await self._restart
        if self._process is None or not self._process.alive:
            raise UnavailableError(f"the Python stub of {self.name} is not running")
        return self._process

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        process = await self._running()
        arrays: list[tuple[str, np.ndarray]] = []
        entries = []
        for request in requests:
            key = self._next_key
            self._next_key += 1
            self._open[key] = (request, responder)
            arrays.extend((f"{key}/{name}", array) for name, array in request.inputs.items())
            entries.append((key, request))
        segment, refs = self._pool.write(arrays)
        by_key: dict[int, list[Any]] = {}
        for ref in refs:
            prefix, name = ref[0].split("/", 1)
            by_key.setdefault(int(prefix), []).append((name, *ref[1:]))
        message = {
            "op": "execute",
            "model_name": self._model.name,
            "segment": segment,
            "requests": [
                _request_item(key, request, by_key.get(key, []), list(responder.signature.outputs))
                for key, request in entries
            ],
        }
        try:
            reply = await process.request(message, "execute_done")
        finally:
            if segment is not None:
                self._pool.release(segment)
        if reply["responses"] is not None:
            self._deliver(reply["responses"])
        if reply["error"] is not None:
            error = InternalError(reply["error"])
            for key, request in entries:
                if self._open.pop(key, None) is not None:
                    responder.send_error(request, error)

    def _on_message(self, message: Message) -> None:
        op = message["op"]
        if op == "responses":
            self._deliver(message)
        elif op == "bls_request":
            task = asyncio.create_task(self._bls(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif op == "release":
            for name in message["segments"]:
                self._pool.release(name)
        elif op == "log":
            logger.log(
                LOG_LEVELS.get(message["level"], logging.INFO),
                "[%s] %s",
                self._model.name,
                message["message"],
            )

    def _deliver(self, message: Message) -> None:
        segment = message["segment"]
        refs = [
            (f"{index}/{ref[0]}", *ref[1:])
            for index, (_, body, _) in enumerate(message["items"])
            if body is not None
            for ref in body["outputs"]
        ]
        arrays = self._reader.arrays(segment, refs, copy=True)
        if segment is not None:
            self._process_send({"op": "release", "segments": [segment]})
        for index, (key, body, final) in enumerate(message["items"]):
            entry = self._open.get(key)
            if entry is None:
                continue
            request, responder = entry
            if final:
                del self._open[key]
            if body is None:
                responder.send_final(request)
            elif body["error"] is not None:
                text, code = body["error"]
                responder.send_error(request, ERRORS.get(code, InternalError)(text))
            else:
                outputs = {ref[0]: arrays[f"{index}/{ref[0]}"] for ref in body["outputs"]}
                responder.send(request, outputs, parameters=body["parameters"], final=final)

    def _process_send(self, message: Message) -> None:
        if self._process is not None and self._process.alive:
            self._process.send(message)

    async def _bls(self, message: Message) -> None:
        """Runs a BLS request from the model through the server and sends back its responses."""
        call = message["call"]
        arrays = self._reader.arrays(message["segment"], message["inputs"], copy=True)
        if message["segment"] is not None:
            self._process_send({"op": "release", "segments": [message["segment"]]})
        parameters = dict(message["parameters"])
        if message["correlation_id"]:
            parameters["sequence_id"] = message["correlation_id"]
            parameters["sequence_start"] = bool(message["flags"] & SEQUENCE_START)
            parameters["sequence_end"] = bool(message["flags"] & SEQUENCE_END)
        request = InferenceRequest(
            model_name=message["model"],
            model_version=message["version"],
            id=message["id"],
            inputs=arrays,
            parameters=parameters,
            requested_outputs=tuple(message["requested"]) or None,
        )
        client = self._server.client
        try:
            if client is None:
                raise UnavailableError("this server offers no in-process client for BLS requests")
            if message["decoupled"]:
                async for response in client.stream(request):
                    self._send_bls_response(call, response.outputs, response.parameters, final=False)
                self._send_bls_response(call, None, None, final=True)
            else:
                response = await client.infer(request)
                self._send_bls_response(call, response.outputs, response.parameters, final=True)
        except CoreserveError as exc:
            self._process_send(
                {
                    "op": "bls_response",
                    "call": call,
                    "error": (exc.message, CODES.get(type(exc), 1)),
                    "response": None,
                    "segment": None,
                    "final": True,
                }
            )

    def _send_bls_response(self, call: int, outputs: Any, parameters: Any, final: bool) -> None:
        segment, refs = self._pool.write(list(outputs.items())) if outputs is not None else (None, [])
        body = {"outputs": refs, "parameters": parameters or {}} if outputs is not None else None
        self._process_send(
            {
                "op": "bls_response",
                "call": call,
                "error": None,
                "response": body,
                "segment": segment,
                "final": final,
            }
        )

    async def close(self) -> None:
        """Runs the model's finalize() and stops the stub."""
        self._closed = True
        if self._restart is not None and not self._restart.done():
            self._restart.cancel()
        if self._process is not None:
            reply = await self._process.stop()
            if reply is not None and reply["error"]:
                logger.error("%s: finalize() failed:\n%s", self.name, reply["error"])
        for task in list(self._tasks):
            task.cancel()
        self._reader.close()
        self._pool.close()


def _request_item(
    key: int, request: InferenceRequest, inputs: list[Any], outputs: list[str]
) -> dict[str, Any]:
    parameters = request.parameters
    flags = (SEQUENCE_START if parameters.get("sequence_start") else 0) | (
        SEQUENCE_END if parameters.get("sequence_end") else 0
    )
    return {
        "key": key,
        "id": request.id,
        "inputs": inputs,
        "requested": list(request.requested_outputs) if request.requested_outputs is not None else outputs,
        "parameters": dict(parameters),
        "correlation_id": parameters.get("sequence_id", 0),
        "flags": flags,
    }
