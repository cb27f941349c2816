"""A client that keeps asking a server whether it is ready while a test attacks it."""

from __future__ import annotations

import http.client
import threading

from coreserve.testing import ServerProcess
from support.waiting import wait_until

# A probe not answered within this is a failure: a deadline so that a server that stopped
# answering fails the test, not a latency figure (the latency is measured in benchmarks).
PROBE_TIMEOUT_S = 10.0


class HealthProbe:
    """GETs /v2/health/ready on a new connection every 50 ms while an attack runs; on exit,
    every probe it sent must have been answered 200."""

    def __init__(self, server: ServerProcess) -> None:
        self._server = server
        self.asked = 0
        self.answered = 0  # 200 or not: a status other than 200 is also a failure
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        host, port = self._server.http_url.rsplit(":", 1)
        while not self._stop.is_set():
            self.asked += 1
            connection = http.client.HTTPConnection(host, int(port), timeout=PROBE_TIMEOUT_S)
            try:
                connection.request("GET", "/v2/health/ready")
                status = connection.getresponse().status
            except OSError as exc:
                self.failures.append(repr(exc))
            else:
                self.answered += 1
                if status != 200:
                    self.failures.append(f"status {status}")
            finally:
                connection.close()
            self._stop.wait(0.05)

    def wait_for_answers(self, count: int) -> None:
        """Waits until the probe has had `count` answers (whatever their status)."""
        wait_until(lambda: self.answered >= count or self.failures, f"{count} health probes answered")

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(PROBE_TIMEOUT_S + 5)
        assert not self._thread.is_alive(), "a health probe outlived its own timeout"
        assert not self.failures, self.failures
        assert self.answered >= 1, "the probe never got an answer"
        assert self.answered == self.asked, f"{self.asked} health probes asked, {self.answered} answered"
