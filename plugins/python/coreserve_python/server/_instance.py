"""One instance of a Python model: a stub process that the server feeds with batches."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from coreserve import (
    CoreserveError,
    InferenceRequest,
    InternalError,
    ModelConfig,
    UnavailableError,
    config_to_dict,
)
from coreserve.backend import InstancePlacement, ModelFiles, Responder, ServerContext
from coreserve_python.ipc import (
    STUB_OWNER,
    CancelMessage,
    ExecuteMessage,
    InitMessage,
    Message,
    SegmentPool,
    SegmentReader,
    segment_prefix,
    segment_to_release,
    write_groups,
)
from coreserve_python.server._bls import BlsServing
from coreserve_python.server._model_requests import ANSWERED_OPS, METRIC_TOLD_OPS, ModelRequestAnswers
from coreserve_python.server._open_requests import OpenRequests, request_item
from coreserve_python.server._process import StubLaunch, StubProcess, log_model_line
from coreserve_python.server._reply_spin import ReplySpin
from coreserve_python.server._spawn import describe_exit

logger = logging.getLogger("coreserve.backend.python")

# Restarts of a stub that cannot start are retried after 0.1 s, 0.2 s, ... up to every 10 s.
RESTART_FIRST_DELAY_S = 0.1
RESTART_MAX_DELAY_S = 10.0
# How long an initialize() that failed gets to run finalize() before its stub is killed.
FAILED_INIT_FINALIZE_S = 5.0


class PythonInstance:
    """Runs batches in a stub process; restarts the stub if it dies.

    A stub that dies costs only the requests it had started (see ipc/_start_mark.py): they fail
    with Triton's words; those handed to it ahead go back to the model's queue. While the stub
    restarts, `serving` is clear and the scheduler gives the instance nothing.
    A restart that fails is retried with backoff for as long as the instance lives; meanwhile
    `failure` says why the instance cannot serve (the core then reports the model version
    UNAVAILABLE with that reason), and it is cleared when a restart succeeds.

    It answers the model's requests through the objects it owns: `ModelRequestAnswers`
    (metrics, model management) and `BlsServing` (BLS requests).
    """

    def __init__(
        self,
        launch: StubLaunch,
        model: ModelFiles,
        config: ModelConfig,
        placement: InstancePlacement,
        server: ServerContext,
        *,
        pipeline_depth: int = 1,
        idle_spin_microseconds: int = 0,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """`pipeline_depth`: executions the stub may be handed while it runs one (the core's
        ModelInstance.pipeline_depth); they wait in the stub's socket, in order, so that under
        load its next batch is there when it finishes one, without a wake-up in between.
        `idle_spin_microseconds`: how long the idle stub looks for its next message before it
        sleeps (up to 4x that where its waits are regular and longer: see ipc.Channel._read),
        and the server for the stub's answer where it serves one request at a time (see
        _reply_spin.py). `on_close` is called once the instance has closed."""
        self.pipeline_depth = pipeline_depth
        self._idle_spin_microseconds = idle_spin_microseconds
        self._on_close = on_close
        self._launch = launch
        self._model = model
        self._config = config
        self._placement = placement
        self._server = server
        self._decoupled = config.model_transaction_policy.decoupled
        self.name = f"model '{model.name}' instance {placement.name}"
        self._pool = SegmentPool(placement.name)
        self._reader = SegmentReader()
        self._open = OpenRequests(self._relay_cancel, self._decoupled)  # given to the stub, open
        # The executions whose execute() waits for the stub's reply, by their responder: if the
        # stub dies, each answers its own requests (see `_stub_died`).
        self._awaiting: set[Responder] = set()
        self._executions = 0  # executions sent to the stub and not yet done
        self._process: StubProcess | None = None
        self._reply_spin: ReplySpin | None = None  # the running stub's, where this instance spins
        self._starting: StubProcess | None = None  # the stub whose initialize() runs
        self._restart: asyncio.Task[None] | None = None
        # Clear from a crash until the first restart attempt has ended, either way: the
        # scheduler gives the instance nothing meanwhile (see ModelInstance.serving).
        self.serving = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._bls = BlsServing(
            self.name, server, self._pool, self._reader, self._open.request, self._process_send
        )
        self._model_requests = ModelRequestAnswers(self.name, server, self._process_send)
        self._closed = False
        self.failure: str | None = None

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

    async def start(self, loading: bool = True) -> None:
        """Starts the stub and runs the model's initialize(); raises with its traceback if it fails.
        `loading`: as the model loads (False: a restart after the stub died).

        Whatever goes wrong (cancellation included), a stub that was spawned is stopped and
        reaped before this raises.
        """
        process = StubProcess(self._launch, self.name, self._on_message, self._on_exit)
        await process.start()
        self._starting = process  # initialize() may ask the server things (metrics, models)
        self._model_requests.loading = loading
        message: InitMessage = {
            "op": "init",
            "model_file": str(self._model.model_file),
            "backend_based": self._model.runtime is not None,
            "args": self._args(),
            "decoupled": self._decoupled,
            "idle_spin_microseconds": self._idle_spin_microseconds,
            "start_mark": process.start_mark_path,
        }
        try:
            reply = await process.request(message, "init_done")
            if reply["error"] is not None:
                raise UnavailableError(f"{self.name}: initialize() failed:\n{reply['error']}")
        except asyncio.CancelledError:
            await process.kill()
            raise
        except BaseException:
            await process.stop(timeout=FAILED_INIT_FINALIZE_S)
            self._model_requests.release_metrics()  # what a failed initialize() made
            raise
        finally:
            self._starting, self._model_requests.loading = None, False
            process.unlink_start_mark()  # mapped by both sides by now (or never to be)
        self._process = process
        self.serving.set()
        activity = self._server.activity
        if self._idle_spin_microseconds and activity is not None:
            self._reply_spin = ReplySpin(process.fileno, self._idle_spin_microseconds * 1000, activity)

    def _on_exit(self, process: StubProcess, code: int | None) -> None:
        """The running stub died: it is restarted, and the requests it had started fail (those
        whose execute() still waits fail there, see `_stub_died`, as the others go back to the
        queue); what is left here are a decoupled model's requests still being answered."""
        if process.pid is not None:  # any stub's: its segments' files are gone, their mappings go too
            self._reader.forget(segment_prefix(STUB_OWNER, process.pid))
        if process is not self._process:
            return  # a stub whose start failed: start() reports that
        self._process = None
        self.serving.clear()
        self._model_requests.release_metrics()  # the restarted model makes its own again
        error = self._died_running(code)
        not_started = 0
        for key, (request, responder, _) in self._open.entries():
            if key > process.last_started_key:
                not_started += 1
            elif responder not in self._awaiting:
                self._open.close(key)
                responder.send_error(request, error)
        logger.error(
            "the Python stub of %s exited unexpectedly (%s) while serving: the requests it had "
            "started fail, the %d it had not started are queued again; restarting it",
            self.name,
            describe_exit(code),
            not_started,
        )
        if not self._closed:
            self._restart = asyncio.create_task(self._restart_until_running(), name=f"{self.name}:restart")

    def _died_running(self, code: int | None) -> InternalError:
        """The error of the requests a stub had started when it died: Triton's words first."""
        return InternalError(
            f"Stub process '{self._placement.name}' is not healthy. It exited unexpectedly "
            f"({describe_exit(code)}) while serving this request; it is being restarted."
        )

    async def _restart_until_running(self) -> None:
        """Restarts the stub, retrying with backoff until it runs (or the instance closes)."""
        delay = RESTART_FIRST_DELAY_S
        while True:
            try:
                await self.start(loading=False)
            except Exception as exc:
                reason = exc.message if isinstance(exc, CoreserveError) else f"{type(exc).__name__}: {exc}"
                if self.failure is None:
                    # Once per outage; an error of ours (not a CoreserveError) with its traceback.
                    logger.error(
                        "%s: restarting the stub failed; the model is unavailable until a restart "
                        "succeeds (retrying every %.1f-%.0f s): %s",
                        self.name,
                        RESTART_FIRST_DELAY_S,
                        RESTART_MAX_DELAY_S,
                        reason,
                        exc_info=None if isinstance(exc, CoreserveError) else exc,
                    )
                self.failure = f"the Python stub of {self.name} cannot be restarted: {reason}"
                self.serving.set()  # its execute() now fails at once, with the failure
                await asyncio.sleep(delay)
                delay = min(2 * delay, RESTART_MAX_DELAY_S)
                continue
            if self.failure is not None:
                logger.info("%s: the stub is running again; the model is available", self.name)
            else:
                logger.info("%s: the stub was restarted", self.name)
            self.failure = None
            return

    def _not_running(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        """Requests given while the stub is not running: back to the queue while it restarts
        (or has died, which the server has not handled yet), an error if it cannot restart."""
        process = self._process
        if self._closed or (process is None and self.serving.is_set()):
            raise UnavailableError(self.failure or f"the Python stub of {self.name} is not running")
        if process is not None:
            self.serving.clear()  # it has died: _on_exit follows (until then, nothing for it)
        error = self._not_started()
        for request in requests:
            responder.requeue(request, error)

    def _stub_died(
        self, process: StubProcess, entries: Sequence[tuple[int, InferenceRequest]], responder: Responder
    ) -> None:
        """Answers the requests of an execution whose stub died before it replied: they fail
        if it had started them (the model may have acted on them), else they are queued again."""
        if entries[0][0] <= process.last_started_key:
            self._fail_started(process, entries, responder)
            return
        if process is self._process:
            self.serving.clear()  # its socket closed first: _on_exit follows (see _not_running)
        error = self._not_started()
        for key, request in entries:
            if self._open.close(key) is not None:
                responder.requeue(request, error)

    def _fail_started(
        self, process: StubProcess, entries: Sequence[tuple[int, InferenceRequest]], responder: Responder
    ) -> None:
        """Fails the requests of an execution that its stub had started when it died."""
        error = self._died_running(process.exit_code)
        for key, request in entries:
            if self._open.close(key) is not None:
                responder.send_error(request, error)

    @property
    def unstarted_requests(self) -> int:
        """Requests handed ahead to the stub that it has not begun (see ModelInstance)."""
        process = self._process
        if process is None:
            return 0
        started = process.started_up_to()
        return sum(1 for key, _ in self._open.entries() if key > started)

    def _not_started(self) -> InternalError:
        """The error of a request the stub died before it ran, where it cannot be queued again."""
        return InternalError(
            f"Stub process '{self._placement.name}' is not healthy. It died before it ran this request; "
            "it is being restarted."
        )

    async def execute(self, requests: Sequence[InferenceRequest], responder: Responder) -> None:
        process = self._process
        if process is None or not process.alive:
            self._not_running(requests, responder)
            return
        entries = [(self._open.add(request, responder), request) for request in requests]
        try:
            segment, refs = write_groups(self._pool, [list(request.inputs.items()) for request in requests])
        except BaseException:  # (a full /dev/shm): never handed to the stub
            self._open.close_all(key for key, _ in entries)
            raise
        message: ExecuteMessage = {
            "op": "execute",
            "model_name": self._model.name,
            "segment": segment,
            "requests": [
                request_item(key, request, inputs, list(responder.signature.outputs))
                for (key, request), inputs in zip(entries, refs, strict=True)
            ],
        }
        behind = self._executions  # sent while the stub still runs earlier ones (pipeline_depth)
        self._executions += 1
        self._awaiting.add(responder)
        taken: list[Exception | None] = []  # once the reply was taken on arrival: what it raised

        def take_alone(reply: Message) -> None:
            # The only execution in flight: its answers are given on the stub socket's callback,
            # so they go out before the bookkeeping that follows (the scheduler's, the
            # statistics'), which runs when this wakes. Under load the bookkeeping comes first,
            # as it sends the instance's next execution.
            if self._executions != 1:
                return
            try:
                self._take_reply(reply, entries, responder, behind)
            except Exception as exc:
                taken.append(exc)
            else:
                taken.append(None)

        try:
            spin = self._reply_spin
            after_send = None if spin is None else spin.after_send
            reply = await process.request(message, "execute_done", after_send=after_send, on_reply=take_alone)
            if spin is not None:
                spin.answered()
        except CoreserveError:  # (the stub died: a live one answers every execution)
            self._stub_died(process, entries, responder)
            return
        finally:
            self._awaiting.discard(responder)
            self._executions -= 1
            if (shared := segment_to_release(segment)) is not None:
                self._pool.release(shared)
        if not taken:
            self._take_reply(reply, entries, responder, behind)
        elif taken[0] is not None:
            raise taken[0]
        if process is not self._process:  # it died after it replied: what it still answers fails
            self._fail_started(process, entries, responder)

    def _take_reply(
        self,
        reply: Message,
        entries: Sequence[tuple[int, InferenceRequest]],
        responder: Responder,
        behind: int,
    ) -> None:
        """Answers an execution's requests from the stub's reply to it."""
        if behind:  # the time it waited in the stub for them is queue time, not compute time
            responder.compute_start_ns = max(responder.compute_start_ns, reply.get("started_ns", 0))
        infer_ns = reply.get("infer_ns")
        if infer_ns:  # before it, the inputs reached the model; after it, the outputs came back
            responder.inputs_ready_ns = max(responder.compute_start_ns, infer_ns[0])
            responder.infer_done_ns = max(responder.inputs_ready_ns, infer_ns[1])
        if reply["responses"] is not None:
            self._deliver(reply["responses"])
        for key in reply.get("withdrawn", ()):
            entry = self._open.close(key)
            if entry is not None:
                responder.withdraw(entry[0])
        for key in reply.get("rescheduled", ()):
            entry = self._open.close(key)
            if entry is not None:  # (not if the model also ended it)
                responder.reschedule(entry[0])
        for key in reply.get("deferred", ()):
            if (request := self._open.request(key)) is not None:  # (not if its sender ended it)
                responder.defer(request)
        if reply["error"] is not None:
            error = InternalError(reply["error"])
            for key, _ in entries:  # a response its sender sent is the answer (Triton's)
                self._open.answer_held(key)
            answered = [request for key, request in entries if self._open.close(key) is not None]
            for request in answered:
                responder.send_error(request, error)
            if not answered:  # (a decoupled model that answered every request, then returned a list)
                logger.error("%s: %s", self.name, reply["error"])

    def _relay_cancel(self, key: int) -> None:
        """Tells the stub that a request it has was cancelled (pb_utils' is_cancelled())."""
        cancel: CancelMessage = {"op": "cancel", "key": key}
        self._process_send(cancel)

    def _on_message(self, message: Message) -> None:
        op = message["op"]
        if op == "responses":
            self._deliver(message)
        elif op == "bls_request":
            self._spawn(self._bls.serve(message))
        elif op == "bls_cancel":
            self._bls.cancel(message["call"])
        elif op in METRIC_TOLD_OPS:
            self._model_requests.metric_told(message)
        elif op in ANSWERED_OPS:
            self._spawn(self._model_requests.answer(message))
        elif op == "release":
            for name in message["segments"]:
                self._pool.release(name)
        elif op == "log":
            log_model_line(message)

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _deliver(self, message: Message) -> None:
        """Answers open requests from a `responses` message of the stub."""
        segment = message["segment"]
        outputs_of = [
            self._reader.arrays(segment, body["outputs"], copy=True) if body is not None else {}
            for _, body, _ in message["items"]
        ]
        if (shared := segment_to_release(segment)) is not None:
            self._process_send({"op": "release", "segments": [shared]})
        self._open.answer(message["items"], outputs_of)

    def _process_send(self, message: Mapping[str, Any]) -> None:
        process = self._process or self._starting
        if process is not None and process.alive:
            process.send(message)

    async def close(self) -> None:
        """Runs the model's finalize() and stops the stub.

        If the server cancels this (its exit timeout ran out), the stub is killed and reaped.
        """
        self._closed = True
        try:
            if self._restart is not None and not self._restart.done():
                self._restart.cancel()
                await asyncio.wait([self._restart])  # its stub, if any, is stopped by then
            if self._process is not None:
                reply = await self._process.stop()
                if reply is not None and reply["error"]:
                    logger.error("%s: finalize() failed:\n%s", self.name, reply["error"])
        finally:
            if self._process is not None:
                await self._process.kill()  # a no-op after stop(); kills if this was cancelled
            for task in list(self._tasks):
                task.cancel()
            self._model_requests.release_metrics()
            self._reader.close()
            self._pool.close()
            if self._on_close is not None:
                self._on_close()
                self._on_close = None
