"""An idle stub looks for its next message before it sleeps (`idle_spin_microseconds`).

The channel's side is checked on a real socket pair, through the CPU time the reading thread
spends: a wait spins (burns CPU) only while messages come soon, and sleeps once one did not.
The server's side: at most one stub per two cores spins, and the parameter's edge values load
and their models answer. The server's own wait for a stub's answer (server/_reply_spin.py) is seen in
the CPU time of its event loop's thread.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from coreserve.testing import ServerProcess
from coreserve_python.ipc import RECENT_WAITS, Channel
from coreserve_python.server._backend import SpinSlots

SPIN_NS = 30_000_000  # 30 ms: long enough to tell spinning from sleeping by CPU time


@pytest.fixture
def channels() -> Iterator[tuple[Channel, Channel]]:
    ours, theirs = socket.socketpair()
    reader, writer = Channel(ours), Channel(theirs)
    yield reader, writer
    reader.close()
    writer.close()


# The writer of the tests that time waits (writer_process): another process, so that the
# reading thread shares its interpreter with nobody (a thread of the test would make it wait
# for the GIL: a sleep too).
# Each line on its stdin, "delay number", sends message `number` `delay` seconds later.
WRITER = """
import socket, sys, time
from coreserve_python.ipc import Channel

writer = Channel(socket.socket(fileno=int(sys.argv[1])))
for line in sys.stdin:
    delay, number = line.split()
    time.sleep(float(delay))
    writer.send({"op": "ping", "n": int(number)})
"""


def _thread_sleeps() -> int:
    """How many times this thread has slept (its voluntary context switches)."""
    status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("voluntary_ctxt"))


def _receive(
    reader: Channel, writer: subprocess.Popen[str], delay_s: float, number: int
) -> tuple[int, float]:
    """How many times the reading thread slept to receive a message sent `delay_s` from now,
    and the CPU milliseconds it spent. Sleeps tell spinning from sleeping however busy the
    machine is: a thread that yields its core to others while it spins spends less CPU."""
    assert writer.stdin is not None
    writer.stdin.write(f"{delay_s} {number}\n")
    writer.stdin.flush()
    sleeps, started = _thread_sleeps(), time.thread_time()
    message = reader.receive(SPIN_NS)
    spent, slept = (time.thread_time() - started) * 1000, _thread_sleeps() - sleeps
    assert message == {"op": "ping", "n": number}
    return slept, spent


@pytest.fixture
def writer_process() -> Iterator[tuple[Channel, subprocess.Popen[str]]]:
    """A channel to read, and the WRITER process that sends on its other end."""
    ours, theirs = socket.socketpair()
    reader = Channel(ours)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(theirs.fileno())],
        stdin=subprocess.PIPE,
        text=True,
        pass_fds=[theirs.fileno()],
    )
    theirs.close()
    try:
        yield reader, writer
    finally:
        writer.stdin.close()  # type: ignore[union-attr]
        writer.wait(timeout=30)
        reader.close()


def test_a_wait_spins_while_messages_come_soon_and_sleeps_after_one_did_not(
    writer_process: tuple[Channel, subprocess.Popen[str]],
) -> None:
    reader, writer = writer_process
    _receive(reader, writer, 0.0, 0)  # the writer has started (a long wait: the next sleeps)
    _receive(reader, writer, 0.0, 0)  # a short one: waits spin again
    # Within the spin: found by looking, the thread never slept.
    assert _receive(reader, writer, 0.01, 1)[0] == 0
    # Past twice the spin: it spun its 30 ms, then slept until the message came.
    slept, spent = _receive(reader, writer, 0.15, 2)
    assert slept >= 1 and spent < 140
    # So the next wait sleeps at once, though its message comes within the spin.
    slept, spent = _receive(reader, writer, 0.01, 3)
    assert slept >= 1 and spent < 5
    # A message that came soon (here: at once) makes waits spin again.
    _receive(reader, writer, 0.0, 4)
    assert _receive(reader, writer, 0.01, 5)[0] == 0


def test_a_spin_stretches_to_regular_waits_a_little_longer_than_it_and_not_under_load(
    writer_process: tuple[Channel, subprocess.Popen[str]],
) -> None:
    """One client whose own part of each call outlasts the spin (grpc's Python client): the
    waits are regular, and a spin that ends just before each message costs its time and the
    sleep too. Once most recent waits are longer than the spin, it stretches to cover them;
    once most are short again (the next message waits already), it is the spin again."""
    reader, writer = writer_process
    regular = 0.05  # past the 30 ms spin, within twice it (so the spin still pays)
    _receive(reader, writer, 0.0, 0)
    _receive(reader, writer, 0.0, 0)
    # The spin runs out before the message comes: it spun, then slept.
    assert _receive(reader, writer, regular, 1)[0] >= 1
    for number in range(2, 2 + RECENT_WAITS // 2):
        _receive(reader, writer, regular, number)
    # Most recent waits were longer than the spin: it stretched, and found them by looking.
    found = [_receive(reader, writer, regular, number)[0] == 0 for number in range(10, 15)]
    assert sum(found) >= 4, found
    # Under load the messages wait already: once most recent waits are short, the spin is
    # 30 ms again, and a wait as long as before sleeps.
    for number in range(20, 20 + RECENT_WAITS):
        _receive(reader, writer, 0.0, number)
    slept, spent = _receive(reader, writer, regular, 40)
    assert slept >= 1 and spent < 45


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


# The server's side of the spin (server/_reply_spin.py): where it serves one request at a time, its event
# loop looks for the stub's answer instead of sleeping. That is seen on the server's main thread
# (the event loop's): in its sleeps (voluntary context switches: one per request, for the
# client's next one, where it spins; two where it also sleeps for the answer), and in its CPU
# time where it must not spin. The model sleeps in execute for the milliseconds its input asks;
# the spin is 10 ms.
SLEEPING_MODEL = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            milliseconds = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            time.sleep(float(milliseconds[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", milliseconds)]))
        return responses
"""
SLEEPING_CONFIG = """
backend: "python"
max_batch_size: 0
input [ {{ name: "MS" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
parameters {{ key: "idle_spin_microseconds" value: {{ string_value: "{spin}" }} }}
"""


@pytest.fixture(scope="module")
def sleeping_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("reply-spin")
    for name, spin in (("spins", "10000"), ("sleeps", "0")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(SLEEPING_MODEL)
        (root / name / "config.pbtxt").write_text(SLEEPING_CONFIG.format(spin=spin))
    process = ServerProcess([root]).start(timeout=120)
    yield process
    log = process.log
    process.close()
    assert "Traceback" not in log


def _loop_cpu_ms(server: ServerProcess) -> float:
    """CPU milliseconds of the server's main thread, which runs the event loop."""
    fields = _loop_file(server, "stat").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _loop_sleeps(server: ServerProcess) -> int:
    """How many times the server's main thread has slept (its voluntary context switches)."""
    for line in _loop_file(server, "status").splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


def _loop_file(server: ServerProcess, name: str) -> str:
    assert server.process is not None
    pid = server.process.pid
    return Path(f"/proc/{pid}/task/{pid}/{name}").read_text()


def _serially(
    server: ServerProcess,
    model: str,
    milliseconds: float,
    requests: int,
    measure: Callable[[ServerProcess], float],
) -> float:
    """How much `measure` grows over `requests` sent one after another, after a warm-up that
    lets a streak of serial executions build. Between two requests the client waits 2 ms, so
    that the loop has slept for each (else how often the next one is there before the loop
    sleeps depends on how busy the machine is)."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("MS", [1], "FP32")
        tensor.set_data_from_numpy(np.array([milliseconds], np.float32))
        for _ in range(12):
            client.infer(model, [tensor])
        before = measure(server)
        for _ in range(requests):
            assert client.infer(model, [tensor]).as_numpy("OUT").tolist() == [milliseconds]
            time.sleep(0.002)
        return measure(server) - before


def test_serving_one_request_at_a_time_the_loop_looks_for_the_answer(sleeping_server: ServerProcess) -> None:
    # 40 executions of 5 ms: the loop sleeps once per request where it spins for the answer
    # (40 sleeps), twice where the model's spin is 0 (80).
    assert _serially(sleeping_server, "spins", 5.0, 40, _loop_sleeps) <= 50
    assert _serially(sleeping_server, "sleeps", 5.0, 40, _loop_sleeps) >= 65


def test_a_model_slower_than_the_spin_seldom_pays_for_it(sleeping_server: ServerProcess) -> None:
    # 30 executions of 25 ms, past the 10 ms spin: after each spin that runs out, twice as many
    # are left out, so about 4 of them spin (40 ms), not 30 (300 ms).
    assert _serially(sleeping_server, "spins", 25.0, 30, _loop_cpu_ms) < 150


def test_with_several_clients_at_once_the_loop_does_not_spin(sleeping_server: ServerProcess) -> None:
    _serially(sleeping_server, "spins", 5.0, 1, _loop_cpu_ms)  # a streak of serial executions first

    def client(_: int) -> None:
        with httpclient.InferenceServerClient(sleeping_server.http_url) as each:
            tensor = httpclient.InferInput("MS", [1], "FP32")
            tensor.set_data_from_numpy(np.array([5.0], np.float32))
            for _ in range(10):
                assert each.infer("spins", [tensor]).as_numpy("OUT").tolist() == [5.0]

    before = _loop_cpu_ms(sleeping_server)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(client, range(4)))
    # 40 executions of 5 ms, each overlapping other clients' requests: a spin through each
    # would cost about 200 ms more than the loop's own work for 40 requests (50-80 ms on the
    # 2-core machines seen; 80 failed a bound of 80 once).
    assert _loop_cpu_ms(sleeping_server) - before < 130
