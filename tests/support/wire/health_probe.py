"""A client that keeps asking a server whether it is ready while a test attacks it."""

from __future__ import annotations

import http.client
import threading
import time

from coreserve.testing import ServerProcess
from support.waiting import wait_until

# The worst latency a health probe may see during an attack: generous, as this machine is
# shared and slow (the aim, measured in benchmarks, is far lower).
PROBE_BOUND_S = 2.0


class HealthProbe:
    """GETs /v2/health/ready on a new connection every 50 ms while an attack runs."""

    def __init__(self, server: ServerProcess) -> None:
        self._server = server
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        host, port = self._server.http_url.rsplit(":", 1)
        while not self._stop.is_set():
            start = time.monotonic()
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                connection.request("GET", "/v2/health/ready")
                status = connection.getresponse().status
            except OSError as exc:
                self.failures.append(repr(exc))
            else:
                self.latencies.append(time.monotonic() - start)
                if status != 200:
                    self.failures.append(f"status {status}")
            finally:
                connection.close()
            self._stop.wait(0.05)

    def wait_for_answers(self, count: int) -> None:
        """Waits until the probe has had `count` answers (whatever their status)."""
        wait_until(lambda: len(self.latencies) >= count or self.failures, f"{count} health probes answered")

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(15)
        assert not self.failures, self.failures
        assert self.latencies, "the probe never got an answer"
        assert max(self.latencies) < PROBE_BOUND_S, f"worst health probe: {max(self.latencies):.3f}s"
