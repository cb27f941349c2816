"""An idle stub looks for its next message before it sleeps (`idle_spin_microseconds`).

The channel's side is checked on a real socket pair, through the CPU time the reading thread
spends: a wait spins (burns CPU) only while messages come soon, and sleeps once one did not.
The server's side: at most one stub per two cores spins, and the parameter's edge values load
and their models answer.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess
from coreserve_python.backend import SpinSlots
from coreserve_python.wire import Channel

SPIN_NS = 30_000_000  # 30 ms: long enough to tell spinning from sleeping by CPU time


@pytest.fixture
def channels() -> Iterator[tuple[Channel, Channel]]:
    ours, theirs = socket.socketpair()
    reader, writer = Channel(ours), Channel(theirs)
    yield reader, writer
    reader.close()
    writer.close()


def _cpu_ms_to_receive(reader: Channel, writer: Channel, delay_s: float, number: int) -> float:
    """The reading thread's CPU milliseconds to receive a message sent `delay_s` from now."""
    timer = threading.Timer(delay_s, writer.send, [{"op": "ping", "n": number}])
    started = time.thread_time()
    timer.start()
    message = reader.receive(SPIN_NS)
    spent = (time.thread_time() - started) * 1000
    timer.join()
    assert message == {"op": "ping", "n": number}
    return spent


def test_a_wait_spins_while_messages_come_soon_and_sleeps_after_one_did_not(
    channels: tuple[Channel, Channel],
) -> None:
    reader, writer = channels
    # Within the spin: found by looking, the thread never slept.
    assert _cpu_ms_to_receive(reader, writer, 0.01, 1) >= 3
    # Past twice the spin: it spun its 30 ms, then slept until the message came.
    assert 10 <= _cpu_ms_to_receive(reader, writer, 0.15, 2) < 140
    # So the next wait sleeps at once: no CPU to speak of.
    assert _cpu_ms_to_receive(reader, writer, 0.15, 3) < 5
    # A message that came soon (here: at once) makes waits spin again.
    assert _cpu_ms_to_receive(reader, writer, 0.0, 4) < 5
    assert _cpu_ms_to_receive(reader, writer, 0.01, 5) >= 3


def test_without_a_spin_a_wait_sleeps(channels: tuple[Channel, Channel]) -> None:
    reader, writer = channels
    threading.Timer(0.05, writer.send, [{"op": "ping"}]).start()
    started = time.thread_time()
    assert reader.receive() == {"op": "ping"}
    assert (time.thread_time() - started) * 1000 < 5


def test_a_peer_that_closes_during_the_spin_ends_the_wait(channels: tuple[Channel, Channel]) -> None:
    reader, writer = channels
    threading.Timer(0.005, writer.close).start()
    assert reader.receive(SPIN_NS) is None


def test_one_stub_spins_per_two_cores() -> None:
    slots = SpinSlots(cores=4)
    assert [slots.claim() for _ in range(3)] == [True, True, False]
    slots.release()  # an instance that spun has closed: the next one may
    assert slots.claim() and not slots.claim()
    single = SpinSlots(cores=1)  # one core still gets a spinner: it yields to whoever waits
    assert single.claim() and not single.claim()


MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)])
            for r in requests
        ]
"""
CONFIG = """
backend: "python"
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
parameters {{ key: "idle_spin_microseconds" value: {{ string_value: "{spin}" }} }}
"""


def test_the_edge_values_serve(tmp_path: Path) -> None:
    for spin in ("0", "10000"):
        (tmp_path / f"spin_{spin}" / "1").mkdir(parents=True)
        (tmp_path / f"spin_{spin}" / "1" / "model.py").write_text(MODEL)
        (tmp_path / f"spin_{spin}" / "config.pbtxt").write_text(CONFIG.format(spin=spin))
    process = ServerProcess([tmp_path]).start(timeout=120)
    try:
        with httpclient.InferenceServerClient(process.http_url) as client:
            for spin in ("0", "10000"):
                for value in (1.0, 2.0, 3.0):  # in a row: the spinning stub finds each while it looks
                    tensor = httpclient.InferInput("IN", [2], "FP32")
                    tensor.set_data_from_numpy(np.array([value, -value], np.float32))
                    answer = client.infer(f"spin_{spin}", [tensor]).as_numpy("OUT")
                    assert answer.tolist() == [2 * value, -2 * value]
        log = process.log
    finally:
        process.close()
    assert "Traceback" not in log
