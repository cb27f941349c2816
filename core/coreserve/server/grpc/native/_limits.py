"""What one connection of the native server may ask of it: sizes, windows and abuse budgets.

The budgets follow the reference servers' mitigations of the HTTP/2 denial-of-service attacks:
- streams the client resets before their answer, and streams refused, spend a stream budget
  (nghttp2's limit on received RST_STREAM, 1000 at once and 33 a second; CVE-2023-44487,
  "rapid reset"); past it the connection gets GOAWAY ENHANCE_YOUR_CALM;
- frames that carry nothing (empty DATA and CONTINUATION frames that end nothing, PRIORITY and
  unknown frames, malformed requests) spend a glitch budget (nghttp2's, 10000 at once and 330 a
  second; CVE-2019-9518 and its kin); past it, GOAWAY ENHANCE_YOUR_CALM;
- a header block may come in at most MAX_CONTINUATIONS CONTINUATION frames (nghttp2's; the
  CONTINUATION flood, CVE-2024-27316), a SETTINGS frame hold at most MAX_SETTINGS entries;
- at most MAX_QUEUED_ACKS answers to SETTINGS and PING frames wait, unwritten, for a client that
  does not read what it is sent (nghttp2's max_outbound_ack; Go's server allows 10000 control
  frames); past it, GOAWAY ENHANCE_YOUR_CALM (the SETTINGS and PING floods, CVE-2019-9512/9515);
- one turn of the event loop reads at most STREAMS_PER_TURN new streams (grpc's
  max_requests_per_read), FRAMES_PER_TURN frames and (past a frame) HEADER_BYTES_PER_TURN of
  header blocks of a connection, so that one connection's flood cannot hold up the others for
  longer than that.
"""

from __future__ import annotations

import asyncio

STREAM_WINDOW = 4 * 1024 * 1024  # what each stream may send ahead of its handler
CONNECTION_WINDOW = 64 * 1024 * 1024
MAX_FRAME_SIZE = 1024 * 1024  # frames we accept: fewer, larger frames for large tensors
MAX_HEADER_LIST = 16 * 1024  # gRPC's own limit on metadata; twice it ends the connection
MAX_HEADER_BLOCK = 2 * MAX_HEADER_LIST  # encoded; a larger block ends the connection
# Streams one connection may have open. Higher than grpcio's 100 (`.._transport`): here the
# stream budget above bounds a rapid reset, so a client may multiplex many calls on one connection.
MAX_CONCURRENT = 1024
MAX_CONTINUATIONS = 8
MAX_SETTINGS = 32
MAX_QUEUED_ACKS = 1000
STREAM_CHURN_BURST, STREAM_CHURN_RATE = 1000, 33.0
GLITCH_BURST, GLITCH_RATE = 10000, 330.0
STREAMS_PER_TURN = 32
FRAMES_PER_TURN = 512
HEADER_BYTES_PER_TURN = 16 * 1024  # of header blocks: the frames that cost the most per byte


class RateBudget:
    """A token bucket: `burst` events at once, refilled at `rate` a second."""

    def __init__(self, burst: int, rate: float) -> None:
        self._burst = burst
        self._rate = rate
        self._tokens = float(burst)
        self._loop = asyncio.get_running_loop()
        self._refilled = self._loop.time()

    def spend(self) -> bool:
        """Takes one token; False when none is left."""
        now = self._loop.time()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
