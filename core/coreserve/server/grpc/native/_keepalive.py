"""The --grpc-keepalive-*, --grpc-http2-* and --grpc-max-connection-age* flags on a native connection.

As gRPC core reads them (its defaults where a flag is not given): the server pings every
keepalive time (only while calls are open unless pings without calls are permitted) and drops a
connection whose client does not answer within the keepalive timeout; a client that pings more
often than the minimum interval while no data flows collects strikes, and past the strikes
allowed gets GOAWAY ENHANCE_YOUR_CALM "too_many_pings"; a connection older than the maximum
age gets GOAWAY, and is closed once the grace has passed too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from coreserve.server.grpc._transport import GrpcTransport

# gRPC core's defaults (Triton's too).
KEEPALIVE_TIME_MS = 7_200_000
KEEPALIVE_TIMEOUT_MS = 20_000
MIN_RECV_PING_INTERVAL_MS = 300_000
MAX_PING_STRIKES = 2
PING_PAYLOAD = b"coreserv"


class KeepaliveTimers:
    """One connection's keepalive pings, ping policing and age limit.

    `send_ping()` writes a PING with PING_PAYLOAD; `go_away(reason, calm)` sends GOAWAY (calm:
    ENHANCE_YOUR_CALM, else NO_ERROR) and lets the open calls finish; `close()` drops the
    connection; `has_calls()` says whether calls are open.
    """

    def __init__(
        self,
        settings: GrpcTransport,
        send_ping: Callable[[], None],
        go_away: Callable[[str, bool], None],
        close: Callable[[], None],
        has_calls: Callable[[], bool],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._send_ping = send_ping
        self._go_away = go_away
        self._close = close
        self._has_calls = has_calls
        self._interval = (settings.keepalive_time_ms or KEEPALIVE_TIME_MS) / 1000
        self._timeout = (settings.keepalive_timeout_ms or KEEPALIVE_TIMEOUT_MS) / 1000
        self._without_calls = bool(settings.keepalive_permit_without_calls)
        interval_ms = settings.http2_min_recv_ping_interval_without_data_ms
        self._min_ping_interval = (MIN_RECV_PING_INTERVAL_MS if interval_ms is None else interval_ms) / 1000
        strikes = settings.http2_max_ping_strikes
        self._max_strikes = MAX_PING_STRIKES if strikes is None else strikes
        self._strikes = 0
        self._last_ping: float | None = None
        self._ping_timer = self._loop.call_later(self._interval, self._ping)
        self._awaiting_ack: asyncio.TimerHandle | None = None
        self._age_timer: asyncio.TimerHandle | None = None
        if settings.max_connection_age_ms is not None:
            self._age_timer = self._loop.call_later(settings.max_connection_age_ms / 1000, self._aged)
        self._grace = settings.max_connection_age_grace_ms

    def _ping(self) -> None:
        if self._without_calls or self._has_calls():
            self._send_ping()
            if self._awaiting_ack is None:
                self._awaiting_ack = self._loop.call_later(self._timeout, self._close)
        self._ping_timer = self._loop.call_later(self._interval, self._ping)

    def ping_acknowledged(self, payload: bytes) -> None:
        if payload == PING_PAYLOAD and self._awaiting_ack is not None:
            self._awaiting_ack.cancel()
            self._awaiting_ack = None

    def data_sent(self) -> None:
        """Headers or data went out: the client's next pings are not idle pings."""
        self._strikes = 0
        self._last_ping = None

    def ping_received(self) -> None:
        now = self._loop.time()
        last, self._last_ping = self._last_ping, now
        if self._has_calls() or last is None or now - last >= self._min_ping_interval:
            return
        self._strikes += 1
        if self._strikes > self._max_strikes:
            self._go_away("too_many_pings", True)

    def _aged(self) -> None:
        self._go_away("max_age", False)
        self._age_timer = None
        if self._grace is not None:
            self._age_timer = self._loop.call_later(self._grace / 1000, self._close)

    def cancel(self) -> None:
        for timer in (self._ping_timer, self._awaiting_ack, self._age_timer):
            if timer is not None:
                timer.cancel()
