"""The model's requests to the server from a process it forked (`multiprocessing` with the fork
start method, `os.fork`), as Triton's stub serves them (its QA's BLS `test_multiprocess`).

A forked child inherits the stub's socket but none of its threads: the answers to its calls
would be read by the parent's reader, and its writes could cut into the parent's. So at each
fork the stub makes a socket pair (`ForkHooks`):
- the child keeps one end as its only way to the server, with requests of its own on it
  (`ServerRequests.for_child`) whose answers a reader thread of the child delivers. Its tensors
  travel inline: a segment of its own would be released to the parent, which does not know it;
- the parent relays (`Relay`, two threads per child): what the child sends goes on to the
  server, each call under a call id of the parent's; the answers go back to the child under its
  own, queued, so that the stub's reader never waits for a child that reads slowly or not at all.
  A child that goes has its open calls cancelled.
Standard library only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import socket
import sys
import threading
from collections.abc import Callable

from coreserve_python.ipc import STUB_OWNER, Channel, Message, SegmentPool
from coreserve_python.stub._requests import ServerRequests


class Relay:
    """The parent's side of one forked child: a thread sends its messages on to the server,
    another writes the answers to it (`answer` only queues them: the stub's reader never waits
    for a child). When the child goes, its calls still open are cancelled."""

    def __init__(self, sock: socket.socket, requests: ServerRequests, ended: Callable[[], None]) -> None:
        self._channel = Channel(sock)
        self._requests = requests
        self._ended = ended
        self._calls: dict[int, int] = {}  # the child's call id: ours
        self._answers: queue.SimpleQueue[tuple[int, Message] | None] = queue.SimpleQueue()
        self._gone = False
        threading.Thread(target=self._relay, name="coreserve-stub-relay", daemon=True).start()
        threading.Thread(target=self._write, name="coreserve-stub-relay-answers", daemon=True).start()

    def answer(self, call_id: int, child_call: int, message: Message) -> None:
        if message.get("final", True):
            self._calls.pop(child_call, None)
        if self._gone:
            self._requests.discard(call_id, message)
        else:
            self._answers.put((call_id, {**message, "call": child_call}))

    def _write(self) -> None:
        while (item := self._answers.get()) is not None:
            call_id, message = item
            if self._gone:
                self._requests.discard(call_id, message)
                continue
            try:
                self._channel.send(message)
            except OSError:  # the child went: what it was sent goes back (its segments)
                self._gone = True
                self._requests.discard(call_id, message)

    def _relay(self) -> None:
        try:
            while (message := self._channel.receive()) is not None:
                if "call" in message:
                    if message["op"] == "bls_cancel":
                        ours = self._calls.get(message["call"])
                        if ours is None:
                            continue  # (ended already)
                    else:
                        ours = self._calls[message["call"]] = self._requests.relay_call(self, message["call"])
                    message["call"] = ours
                self._requests.send(message)
        except OSError:
            pass  # the child's end was reset, or the server's: either way nothing more to relay
        finally:
            self._gone = True
            with contextlib.suppress(OSError):  # (the server went too: nothing to cancel)
                for ours in list(self._calls.values()):  # nobody waits for them any more
                    self._requests.send({"op": "bls_cancel", "call": ours})
            self._answers.put(None)
            self._channel.close()
            self._ended()


class _ChildReader:
    """A forked child's reader of its end: started with its first call."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._lock = threading.Lock()
        self._started = False
        self.requests: ServerRequests | None = None

    def wake(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                threading.Thread(target=self._run, name="coreserve-forked-reader", daemon=True).start()

    def _run(self) -> None:
        assert self.requests is not None
        with contextlib.suppress(OSError):
            while (message := self._channel.receive()) is not None:
                self.requests.deliver(message)
        self.requests.server_gone()


class ForkHooks:
    """The stub's `os.register_at_fork` hooks (see the module's docstring)."""

    def __init__(
        self,
        requests: ServerRequests,
        server_channel: Channel,
        install: Callable[[ServerRequests], None],
    ) -> None:
        """`install`: makes the child's requests the model's (pb_utils' runtime and calls)."""
        self._requests = requests
        self._server_channel = server_channel
        self._install = install
        self._pairs = threading.local()  # the pair of the fork this thread makes
        # The parent's ends of its children's pairs: a later child closes them (they are not its).
        self._relayed: set[socket.socket] = set()

    def register(self) -> None:
        """Called once per stub process: hooks cannot be unregistered."""
        os.register_at_fork(
            before=self._before, after_in_parent=self._in_parent, after_in_child=self._in_child
        )

    def _before(self) -> None:
        self._pairs.ends = socket.socketpair()

    def _in_parent(self) -> None:
        ours, theirs = self._pairs.ends
        del self._pairs.ends
        theirs.close()
        self._relayed.add(ours)
        # (A fork that failed: the relay sees the end at once.)
        Relay(ours, self._requests, functools.partial(self._relayed.discard, ours))

    def _in_child(self) -> None:
        parents, ours = self._pairs.ends
        del self._pairs.ends
        parents.close()
        for sibling in list(self._relayed):  # (so that a sibling's end closes with its parent)
            sibling.close()
        self._relayed.clear()
        self._server_channel.close()  # the parent's alone: the server sees it close with the parent
        channel = Channel(ours)
        reader = _ChildReader(channel)
        # Every tensor inline (see the module's docstring).
        reader.requests = self._requests.for_child(channel, SegmentPool(STUB_OWNER, sys.maxsize), reader.wake)
        self._install(reader.requests)
        # A fork of this child's is relayed here, and on through the parent.
        self._requests, self._server_channel = reader.requests, channel
