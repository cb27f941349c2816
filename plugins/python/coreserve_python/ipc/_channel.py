"""The stub IPC's channel: framed messages on the socket pair between the server and a stub.

Messages are pickled dicts of plain values (the protocol: `_messages`), each prefixed by its
length. `Channel` reads and writes them on a blocking socket (the stub's side, and the server's
one-shot stubs); the server's asyncio side cuts frames with `FRAME_LENGTH` as they arrive.
Standard library only.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any

from coreserve_python.ipc._messages import Message

# Each message: its length (4 bytes, little-endian), then the pickled dict.
FRAME_LENGTH = struct.Struct("<I")
# What one recv asks for: a few small messages at once.
RECEIVE_CHUNK = 64 * 1024
# How far a receive's spin may stretch past the model's idle_spin_microseconds (Channel._read).
SPIN_STRETCH = 4
# The waits whose median tells how long the next one will likely be (Channel._read).
RECENT_WAITS = 9


class Channel:
    """Length-prefixed pickled messages on a blocking socket; `send` may be called from any thread.

    `receive` (one thread at a time) reads what the socket has, up to RECEIVE_CHUNK bytes, and
    keeps what follows the message for the next call: one recv per message, not one for the
    length and one for the body.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._received = bytearray()
        self._spin_pays = True  # see _read
        self._waits = [0] * RECENT_WAITS  # the last waits for a message, in ns (see _read)
        self._wait_index = 0

    def send(self, message: Mapping[str, Any]) -> None:
        data = pickle.dumps(message, protocol=5)
        with self._send_lock:
            self._sock.sendall(FRAME_LENGTH.pack(len(data)) + data)

    def receive(self, spin_ns: int = 0) -> Message | None:
        """The next message, or None when the other side has gone.

        `spin_ns`, for a thread with nothing else to do: look for the message without sleeping
        for up to this long before sleeping on the socket (see _read).
        """
        if not self._fill(FRAME_LENGTH.size, spin_ns):
            return None
        end = FRAME_LENGTH.size + FRAME_LENGTH.unpack_from(self._received)[0]
        if not self._fill(end, spin_ns):
            return None
        body = bytes(memoryview(self._received)[FRAME_LENGTH.size : end])
        del self._received[:end]
        message: Message = pickle.loads(body)
        return message

    def _fill(self, size: int, spin_ns: int = 0) -> bool:
        """Reads until `size` bytes are buffered; False if the other side closed first."""
        while len(self._received) < size:
            chunk = self._read(max(RECEIVE_CHUNK, size - len(self._received)), spin_ns)
            if not chunk:
                return False
            self._received += chunk
        return True

    def _read(self, size: int, spin_ns: int) -> bytes:
        """One recv, after up to `spin_ns` (or more, below) of non-blocking tries.

        A process that sleeps on its socket is woken by the kernel when data comes, and on a
        virtual machine that wake-up (and the idle core's own) costs more than a small model's
        execute, so a stub under a steady stream of requests answers more of them when it spins
        (benchmarks/python/python_speed.py measures it). The spin is adaptive:
        - after a wait that lasted over twice the spin (spin included; a sleeper also takes its
          wake-up to see the data), the next wait sleeps at once, until a wait is short again.
          So a stub whose requests are sparse does not spin for each of them;
        - where most waits are longer than `spin_ns` but short (one client whose own part of
          each call takes longer: grpc's Python client, perf_analyzer), the spin stretches to
          1.5x the median of the last RECENT_WAITS waits (where that median is over `spin_ns`
          and at most SPIN_STRETCH times it), up to SPIN_STRETCH times `spin_ns`: a spin that
          ends just before the message comes costs its time and the wake-up too. Under load
          most waits are near zero (the next execution is there already) and the spin stays
          `spin_ns`, however long the few others are.
        """
        if not spin_ns:
            return self._sock.recv(size)
        started = time.perf_counter_ns()
        waits = self._waits
        spin = spin_ns
        typical = sorted(waits)[RECENT_WAITS // 2]
        if spin_ns < typical <= SPIN_STRETCH * spin_ns:
            spin = min(typical * 3 // 2, SPIN_STRETCH * spin_ns)
        if self._spin_pays:
            deadline = started + spin
            while True:
                try:
                    chunk = self._sock.recv(size, socket.MSG_DONTWAIT)
                    break
                except BlockingIOError:
                    if time.perf_counter_ns() >= deadline:
                        chunk = self._sock.recv(size)
                        break
                    os.sched_yield()  # a thread waiting for this core comes first
        else:
            chunk = self._sock.recv(size)
        waited = time.perf_counter_ns() - started
        self._spin_pays = waited <= 2 * spin
        waits[self._wait_index] = waited
        self._wait_index = (self._wait_index + 1) % RECENT_WAITS
        return chunk

    def close(self) -> None:
        self._sock.close()


def encode_frame(message: Mapping[str, Any]) -> bytes:
    data = pickle.dumps(message, protocol=5)
    return FRAME_LENGTH.pack(len(data)) + data
