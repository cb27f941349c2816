"""The stub: the process that runs one instance of a Python model.

    python -m coreserve_python.stub FD SERVER_PID

FD is this end of the socket pair the server made. The main thread loads `model.py` and runs
`initialize`, `execute` and `finalize` as the server asks; it reads the server's messages while
idle, and a standby thread reads them while the model runs, so that BLS responses reach a model
that waits for them inside `execute` (see `_inbox`); the model's requests to the server (BLS,
metrics, model management) are `_requests`.

A stub dies with its server, however the server ends (SIGKILL, the OOM killer, a crash): on
Linux the kernel kills it when the server's thread that spawned it dies (PR_SET_PDEATHSIG);
everywhere, the thread that reads ends the process when the server's end of the socket closes,
even while the model is busy in `execute` (only the server holds that end, so it closes
exactly when the server exits or lets the stub go). Standard library and numpy only.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import coreserve_python.pb_utils.inference as _inference
import coreserve_python.pb_utils.runtime as _runtime
from coreserve_python import pb_utils
from coreserve_python.ipc import (
    STUB_OWNER,
    AutoCompleteDoneMessage,
    Channel,
    ExecuteDoneMessage,
    FinalizeDoneMessage,
    InitDoneMessage,
    Message,
    ResponsesMessage,
    SegmentPool,
    SegmentReader,
    open_start_mark,
    segment_to_release,
)
from coreserve_python.stub._forked import ForkHooks
from coreserve_python.stub._inbox import Inbox
from coreserve_python.stub._model_file import describe, failed_execution, load_model_module
from coreserve_python.stub._requests import ServerRequests, executing_keys, in_context
from coreserve_python.stub._responses import responses_message, returned_responses

# Where `import triton_python_backend_utils` finds pb_utils (coreserve_python/shim/).
SHIM = Path(__file__).resolve().parents[1] / "shim"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# How long the main thread may take to finish after the server closed the socket.
EXIT_GRACE_S = 1.0


def die_with_server(server_pid: int) -> None:
    """Asks the kernel to kill this stub when its server dies; exits now if it already has.

    The signal follows the thread that spawned the stub, which is the server's event loop
    thread: it lives as long as the server does.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(ImportError, OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # The server may have died before prctl ran: then this stub was given to another parent.
    if os.getppid() != server_pid:
        os._exit(1)


class Stub:
    """Runs the model and answers the server; the model's requests go through the `ServerRequests`
    it owns, which it installs as pb_utils' runtime."""

    def __init__(self, channel: Channel) -> None:
        self._instance_name = ""
        self._channel = channel
        self._pool = SegmentPool(STUB_OWNER)
        self._reader = SegmentReader()
        self._inbox = Inbox(channel, self._handle, self._server_gone, self._abandon)
        wake = self._inbox.wake
        self._requests = ServerRequests(channel, self._pool, self._reader, wake, self.send_response)
        # The cancellation flags of the requests given to the model and not yet answered in
        # full, by key; the reader thread sets them when the server says "cancel".
        self._cancellations: dict[int, pb_utils._Cancellation] = {}
        # Cancellations of requests whose execute waits behind the one running (the server
        # hands executions ahead): keys above every key registered so far, taken on arrival.
        self._early_cancels: set[int] = set()
        self._highest_key = -1
        self._cancel_lock = threading.Lock()
        self._model: Any = None
        self._decoupled = False
        # Coroutines of the model (async initialize, execute, finalize) run on this loop, in a
        # thread of its own: the executions of a decoupled model's `async def execute` overlap
        # there while the main thread takes the next batch, as Triton runs them.
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="coreserve-stub-loop", daemon=True).start()
        self._finished = threading.Event()
        # The key of the last request handed to the model, where the server reads it after a
        # crash (see ipc/_start_mark.py); the server's mark once init gives it.
        self._started = open_start_mark(None)
        _install(self._requests)
        ForkHooks(self._requests, channel, _install).register()  # BLS from a process the model forks

    def _run_coroutine(self, coroutine: Any) -> Any:
        """Runs a coroutine of the model on the stub's loop and waits for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    # The server's messages.

    def run(self) -> None:
        self._inbox.start()
        handlers = {"init": self._init, "auto_complete": self._auto_complete, "execute": self._execute}
        try:
            while (message := self._inbox.next_work()) is not None:
                if message["op"] == "finalize":
                    self._finalize(message)
                    break
                handlers[message["op"]](message)
        except ConnectionError:
            pass  # the server went away: nobody is left to answer
        finally:
            self._pool.close()
            self._reader.close()
            self._finished.set()

    def _handle(self, message: Message) -> bool:
        """Handles a message that is not work for the main thread; False for work."""
        op = message["op"]
        if op == "release":
            for name in message["segments"]:
                self._pool.release(name)
        elif op in ("bls_response", "reply"):
            self._requests.deliver(message)
        elif op == "cancel":
            self._cancel(message["key"])
        else:
            return False
        return True

    def _register_cancellation(self, key: int, cancellation: pb_utils._Cancellation) -> None:
        """A request reaches the model: its cancellation flag, set at once if cancelled already."""
        with self._cancel_lock:
            self._cancellations[key] = cancellation
            self._highest_key = max(self._highest_key, key)
            if key in self._early_cancels:
                self._early_cancels.discard(key)
                cancellation.cancelled = True

    def _cancel(self, key: int) -> None:
        """The server says a request was cancelled (its client gave up)."""
        with self._cancel_lock:
            cancellation = self._cancellations.get(key)
            if cancellation is not None:
                cancellation.cancelled = True
            elif key > self._highest_key:  # its execute is still to come (keys only grow)
                self._early_cancels.add(key)
            # (else it was answered meanwhile)

    def _server_gone(self) -> None:
        """The server closed its end: whoever waits for an answer from it gets none."""
        self._requests.server_gone()

    def _abandon(self) -> None:
        """The server went away while the model was busy: ends the process after a grace."""
        # Nobody is left to answer: a model still busy (in execute, say) must not keep the
        # process alive. One that returns ends the stub by itself well within the grace.
        if not self._finished.wait(EXIT_GRACE_S):
            sys.stdout.flush()
            sys.stderr.flush()
            _end_forked_processes()
            os._exit(0)

    def _init(self, message: Message) -> None:
        try:
            args = message["args"]
            self._instance_name = args.get("model_instance_name", "")
            backend_based = message.get("backend_based", False)
            # get_model_dir(): the model's version folder, whichever file it runs
            version_folder = Path(args["model_repository"], args["model_version"]) if backend_based else None
            model_file = Path(message["model_file"])
            self._requests.serve_model(self._instance_name, str(version_folder or model_file.parent))
            module = load_model_module(model_file, backend_based)
            self._decoupled = message["decoupled"]
            self._inbox.idle_spin_ns = message["idle_spin_microseconds"] * 1000
            self._started = open_start_mark(message.get("start_mark"))
            self._model = module.TritonPythonModel()
            if hasattr(self._model, "initialize"):
                result = self._model.initialize(message["args"])
                if inspect.iscoroutine(result):
                    self._run_coroutine(result)
            self._requests.serving = True
        except BaseException as exc:
            error = describe(exc)
            failed: InitDoneMessage = {"op": "init_done", "reply_to": message.get("id"), "error": error}
            self._channel.send(failed)
            return
        done: InitDoneMessage = {"op": "init_done", "reply_to": message.get("id"), "error": None}
        self._channel.send(done)

    def _auto_complete(self, message: Message) -> None:
        try:
            module = load_model_module(Path(message["model_file"]), message.get("backend_based", False))
            config = pb_utils.ModelConfig(message["config"])
            complete = getattr(module.TritonPythonModel, "auto_complete_config", None)
            returned: object = config if complete is None else complete(config)
            if isinstance(returned, pb_utils.ModelConfig):
                completed, error = returned.as_dict(), None
            else:  # (a function that forgot its return, most often) in Triton's words
                completed = None
                error = (
                    f"auto_complete_config function in model '{message['config'].get('name', '')}' "
                    "must return a valid pb.ModelConfig object."
                )
        except BaseException as exc:
            completed, error = None, describe(exc)
        reply: AutoCompleteDoneMessage = {
            "op": "auto_complete_done",
            "reply_to": message.get("id"),
            "config": completed,
            "error": error,
        }
        self._channel.send(reply)

    def _execute(self, message: Message) -> None:
        started_ns = time.monotonic_ns()
        segment = message["segment"]
        requests = []
        for item in message["requests"]:
            arrays = self._reader.arrays(segment, item["inputs"], copy=self._decoupled)
            request = pb_utils.InferenceRequest._served(
                item["key"],
                message["model_name"],
                [pb_utils.Tensor._wrap(name, array) for name, array in arrays.items()],
                item["requested"],
                item["correlation_id"],
                item["parameters"],
                item["flags"],
                item["id"],
                item.get("cancelled", False),
                item.get("timeout", 0),
                self._decoupled,
            )
            self._register_cancellation(item["key"], request._cancellation)
            requests.append(request)
        keys = tuple(item["key"] for item in message["requests"])
        if requests and all(request.is_cancelled() for request in requests):
            # Cancelled while they waited behind other executions: the model never gets them,
            # as a request cancelled in the server's queue never reaches it.
            self._withdraw(message, keys, started_ns)
            return
        if keys:  # from here on the model may act on them: they must not run again elsewhere
            self._started[0] = keys[-1]
        error = None
        responses: ResponsesMessage | None = None
        rescheduled: list[int] = []
        deferred: list[int] = []
        token = executing_keys.set(keys)
        infer_ns = [time.monotonic_ns(), 0]  # the model's execute: the statistics' compute-infer
        try:
            result = self._model.execute(requests)
            if inspect.iscoroutine(result):
                if self._decoupled:
                    # Runs on while this thread takes the next batch; its responses go through
                    # the senders, as any decoupled model's.
                    self._start_execution(result, keys)
                else:
                    result = self._run_coroutine(in_context(result, keys))
            infer_ns[1] = time.monotonic_ns()
            # A return value Triton refuses is the model's mistake: no stub traceback.
            refused = None
            if not self._decoupled:
                items, refused = returned_responses(requests, result, deferred)
                responses = responses_message(self._pool, items) if refused is None else None
            elif result is not None and not inspect.iscoroutine(result):  # its requests would wait for good
                refused = (
                    f"Python model '{self._instance_name}' is using the decoupled mode and the execute "
                    "function must return None."
                )
            if refused is not None:
                error = failed_execution(self._instance_name, refused)
            # Handed back to the server (RESCHEDULE): they come again in a later execute.
            rescheduled = [request._key or 0 for request in requests if request._rescheduled()]
        except BaseException as exc:
            error = failed_execution(self._instance_name, describe(exc))
            self._requests.log("ERROR", error, "")  # the model's fault, as Triton logs it (no stub frames)
        finally:
            executing_keys.reset(token)
        if error is not None:  # the server ends every request of the batch: their senders close
            deferred = []
            for request in requests:
                if request._sender is not None:
                    request._sender._close()
        # An ordinary model's responses travel with the end of the execution: one message. It
        # goes before this execution's cleanup, which the server need not wait for.
        self._send_execute_done(
            message,
            started_ns,
            error,
            responses,
            rescheduled=rescheduled if error is None else [],
            deferred=deferred,
            infer_ns=infer_ns if infer_ns[1] else None,
        )
        if error is not None or not self._decoupled:  # answered now, but for the deferred ones
            for item in message["requests"]:
                if item["key"] not in deferred:
                    self._cancellations.pop(item["key"], None)
        for key in rescheduled:
            self._cancellations.pop(key, None)

    def _withdraw(self, message: Message, keys: tuple[int, ...], started_ns: int) -> None:
        """Answers an execute whose requests were all cancelled before it started."""
        for key in keys:
            self._cancellations.pop(key, None)
        self._send_execute_done(message, started_ns, None, None, withdrawn=list(keys))

    def _send_execute_done(
        self,
        message: Message,
        started_ns: int,
        error: str | None,
        responses: ResponsesMessage | None,
        *,
        rescheduled: list[int] | None = None,
        withdrawn: list[int] | None = None,
        deferred: list[int] | None = None,
        infer_ns: list[int] | None = None,
    ) -> None:
        shared = segment_to_release(message["segment"])
        done: ExecuteDoneMessage = {
            "op": "execute_done",
            "reply_to": message.get("id"),
            "started_ns": started_ns,
            "error": error,
            "responses": responses,
            "release": [shared] if shared else [],
            "rescheduled": rescheduled or [],
            "withdrawn": withdrawn or [],
            "deferred": deferred or [],
            "infer_ns": infer_ns,
        }
        self._channel.send(done)

    def _start_execution(self, coroutine: Any, keys: tuple[int, ...]) -> None:
        """Starts a decoupled model's `async def execute` on the stub's loop, not waiting for it."""
        future = asyncio.run_coroutine_threadsafe(in_context(coroutine, keys), self._loop)

        def finished(done: Any) -> None:
            exc = done.exception()
            if exc is None:
                return
            text = failed_execution(self._instance_name, describe(exc))
            self._requests.log("ERROR", text, "")
            # The requests it left unanswered fail with its error instead of waiting forever.
            error = pb_utils.TritonError(text)
            for key in keys:
                if key in self._cancellations:
                    with contextlib.suppress(OSError):
                        self.send_response(
                            key,
                            pb_utils.InferenceResponse(error=error),
                            pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                        )

        future.add_done_callback(finished)

    def _finalize(self, message: Message) -> None:
        error = None
        initialized, self._requests.serving = self._requests.serving, False
        # (Not after an initialize() that raised, as Triton: what it was to set may be missing.)
        if initialized and hasattr(self._model, "finalize"):
            try:
                result = self._model.finalize()
                if inspect.iscoroutine(result):
                    self._run_coroutine(result)
            except BaseException as exc:
                error = describe(exc)
        done: FinalizeDoneMessage = {"op": "finalize_done", "reply_to": message.get("id"), "error": error}
        self._channel.send(done)

    # Responses to the server.

    def send_response(self, key: int, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self._channel.send(responses_message(self._pool, [(key, response, final)]))
        if final:  # (an error response without the flag does not end the request: Triton's)
            self._cancellations.pop(key, None)


def _install(requests: ServerRequests) -> None:
    """Makes `requests` the way of pb_utils' runtime and calls to the server."""
    _runtime.install(requests)
    _inference.install_calls(requests)


def main(argv: list[str]) -> int:
    # The server decides when a stub ends (finalize, or its socket closing), not a terminal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(argv) > 2:
        die_with_server(int(argv[2]))
    sys.path.insert(0, str(SHIM))
    channel = Channel(socket.socket(fileno=int(argv[1])))
    sys.argv[:] = [""]  # the model's, as Triton's stub leaves it (unittest.main() in a model reads it)
    Stub(channel).run()
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    _end_forked_processes()
    os._exit(0)  # daemon threads and user threads must not keep a finished stub alive


def _end_forked_processes() -> None:
    """Asks the processes the model forked and left (one that sleeps, say) to end with the stub:
    SIGTERM to each other member of its process group, which a stub the server started leads (a
    stub started otherwise has none of its own: nothing is sent). Found in /proc (Linux), as
    killpg would reach the stub too, and only its main thread could make it ignore the signal."""
    me = os.getpid()
    if os.getpgrp() != me:
        return
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(entry.path, "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[2]) == me:  # (state, parent, group)
                    os.kill(int(entry.name), signal.SIGTERM)
