"""A reload that changes only `instance_group` adds and retires instances in place, as Triton's
does (its QA L0_model_update `instance_update_test.py`): the instances alike in both
configurations keep serving, only the new ones are initialized, and those left over are
finalized before the load returns (under sequence batching, once the sequences they hold end);
clients sending meanwhile see no failure."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory, ServerProcess
from support.client_threads import ClientThreads
from support.waiting import wait_until

# Counts its instances' initialize and finalize calls in files of a folder the configuration
# names; a request whose input is 1 waits for the file `release` there.
COUNTING_MODEL = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.folder = config["parameters"]["COUNTS"]["string_value"]
        self._count("initialize")

    def _count(self, kind):
        with open(os.path.join(self.folder, kind), "a") as f:
            f.write("1\\n")

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value.flat[0] == 1:
                with open(os.path.join(self.folder, "started"), "a") as f:
                    f.write("1\\n")
                while not os.path.exists(os.path.join(self.folder, "release")):
                    time.sleep(0.01)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value * 2)]))
        return responses

    def finalize(self):
        self._count("finalize")
"""
MAX_SECONDS = 60.0
ClientOf = Callable[[ServerProcess], httpclient.InferenceServerClient]


class Counted:
    """The model folder, its configuration, and the counts its instances write."""

    def __init__(self, root: Path) -> None:
        self.model = root / "models" / "counted"
        self.counts = root / "counts"
        self.counts.mkdir(parents=True)
        (self.model / "1").mkdir(parents=True)
        (self.model / "1" / "model.py").write_text(COUNTING_MODEL)
        self.batching = False

    def configure(self, groups: str, batching: bool | None = None, extra: str = "") -> None:
        if batching is not None:
            self.batching = batching
        batch = "max_batch_size: 8\ndynamic_batching {}\n" if self.batching else "max_batch_size: 0\n"
        (self.model / "config.pbtxt").write_text(
            'backend: "python"\n'
            f"{batch}"
            'input [ { name: "IN" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
            f"instance_group [ {groups} ]\n"
            f'parameters {{ key: "COUNTS" value: {{ string_value: "{self.counts}" }} }}\n'
            f"{extra}"
        )

    def count(self, kind: str) -> int:
        path = self.counts / kind
        return len(path.read_text().splitlines()) if path.exists() else 0


def _cpu(count: int) -> str:
    return f"{{ count: {count} kind: KIND_CPU }}"


def _infer(client: httpclient.InferenceServerClient, value: int = 3, batching: bool = False) -> int:
    shape = [1, 1] if batching else [1]
    tensor = httpclient.InferInput("IN", shape, "INT64")
    tensor.set_data_from_numpy(np.full(shape, value, np.int64))
    return int(client.infer("counted", [tensor]).as_numpy("OUT").flat[0])


@pytest.fixture
def counted(tmp_path: Path) -> Counted:
    return Counted(tmp_path)


@pytest.fixture
def start(coreserve_server: ServerFactory, counted: Counted) -> Callable[..., ServerProcess]:
    def start(*flags: str) -> ServerProcess:
        return coreserve_server(
            counted.model.parent, "--model-control-mode=explicit", "--load-model=counted", *flags
        )

    return start


@pytest.fixture
def client_of() -> Iterator[ClientOf]:
    clients: list[httpclient.InferenceServerClient] = []

    def client_of(server: ServerProcess) -> httpclient.InferenceServerClient:
        clients.append(httpclient.InferenceServerClient(server.http_url, network_timeout=60))
        return clients[-1]

    yield client_of
    for client in clients:
        client.close()


def _update(
    client: httpclient.InferenceServerClient, counted: Counted, groups: str, added: int, removed: int
) -> None:
    """Loads `groups` and checks that exactly `added` instances were initialized and `removed`
    finalized, the latter before the load returned (Triton's QA checks so)."""
    initialized, finalized = counted.count("initialize"), counted.count("finalize")
    counted.configure(groups)
    client.load_model("counted")
    assert (counted.count("initialize"), counted.count("finalize")) == (
        initialized + added,
        finalized + removed,
    )
    assert _infer(client, 4, counted.batching) == 8


@pytest.mark.parametrize("batching", [False, True], ids=["no-batching", "dynamic-batching"])
def test_instances_are_added_and_removed_while_clients_send(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf, batching: bool
) -> None:
    counted.configure(_cpu(3), batching)
    server = start()
    client = client_of(server)
    assert counted.count("initialize") == 3
    with ClientThreads(server.http_url, lambda sender: _infer(sender, 3, batching), 3, MAX_SECONDS) as loop:
        _update(client, counted, _cpu(4), added=1, removed=0)
        _update(client, counted, _cpu(3), added=0, removed=1)
        _update(client, counted, _cpu(1), added=0, removed=2)
        _update(client, counted, _cpu(3), added=2, removed=0)
    assert loop.failures == [] and loop.answers and set(loop.answers) == {6}
    assert "instance(s) added and" in server.log
    client.unload_model("counted")
    wait_until(
        lambda: counted.count("finalize") == counted.count("initialize"), "every instance is finalized"
    )


def test_regrouping_alike_instances_creates_and_removes_none(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    counted.configure('{ name: "group" count: 3 kind: KIND_CPU }')
    client = client_of(start())
    # Names and counts aside, the groups ask for alike instances: all three stay.
    _update(
        client,
        counted,
        '{ name: "one" count: 1 kind: KIND_CPU }, { name: "two" count: 2 kind: KIND_CPU }',
        0,
        0,
    )
    # A count of 0 is the backend's default (one instance), as on Triton.
    _update(client, counted, "{ count: 0 kind: KIND_CPU }", added=0, removed=2)
    # A group whose settings differ (a rate limiter's priority) asks for other instances.
    _update(client, counted, "{ count: 1 kind: KIND_CPU rate_limiter { priority: 2 } }", added=1, removed=1)


def test_a_change_beyond_the_instance_groups_reloads_the_version(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    counted.configure(_cpu(2))
    client = client_of(start())
    counted.configure(_cpu(3), batching=True)
    client.load_model("counted")
    assert counted.count("initialize") == 2 + 3
    wait_until(lambda: counted.count("finalize") == 2, "the old version's two instances are finalized")
    # The model's file changed too: the whole version loads again.
    (counted.model / "1" / "model.py").write_text(COUNTING_MODEL + "\n")
    counted.configure(_cpu(4))
    client.load_model("counted")
    assert counted.count("initialize") == 5 + 4
    wait_until(lambda: counted.count("finalize") == 5, "the old version's three instances are finalized")
    assert _infer(client, 4, batching=True) == 8


def test_a_configuration_given_to_the_load_adds_an_instance(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    counted.configure(_cpu(1))
    client = client_of(start())
    config = client.get_model_config("counted")
    config["instance_group"][0]["count"] += 1
    client.load_model("counted", config=json.dumps(config))
    assert (counted.count("initialize"), counted.count("finalize")) == (2, 0)
    assert _infer(client) == 6


def test_a_retired_instance_finishes_its_request_before_the_load_returns(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    counted.configure(_cpu(2))
    server = start()
    with ThreadPoolExecutor(3) as pool:
        try:
            held = [pool.submit(_infer, client_of(server), 1) for _ in range(2)]  # one on each instance
            wait_until(lambda: counted.count("started") == 2, "both instances run a held request")
            counted.configure(_cpu(1))
            load = pool.submit(client_of(server).load_model, "counted")
            wait_until(lambda: "version 1 is unchanged" in server.log, "the load keeps the version")
            time.sleep(0.5)
            assert not load.done()  # the retired instance still runs its request
        finally:
            (counted.counts / "release").touch()
        load.result(timeout=MAX_SECONDS)
        assert [future.result(timeout=MAX_SECONDS) for future in held] == [2, 2]
    assert (counted.count("initialize"), counted.count("finalize")) == (2, 1)


def test_adding_an_instance_does_not_wait_for_a_running_request(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    counted.configure(_cpu(1))
    server = start()
    with ThreadPoolExecutor(2) as pool:
        try:
            held = pool.submit(_infer, client_of(server), 1)
            wait_until(lambda: counted.count("started") == 1, "the instance runs a held request")
            counted.configure(_cpu(2))
            client = client_of(server)
            client.load_model("counted")  # returns while the request still runs
            assert not held.done()
            assert _infer(client, 4) == 8  # the new instance answers
        finally:
            (counted.counts / "release").touch()
        assert held.result(timeout=MAX_SECONDS) == 2
    assert (counted.count("initialize"), counted.count("finalize")) == (2, 0)


def test_under_the_rate_limiter_instances_change_in_place(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    limited = 'kind: KIND_CPU rate_limiter { resources [ { name: "R1" count: 1 } ] }'
    counted.configure(f"{{ count: 2 {limited} }}")
    client = client_of(start("--rate-limit=execution_count"))
    _update(client, counted, f"{{ count: 3 {limited} }}", added=1, removed=0)
    _update(client, counted, f"{{ count: 1 {limited} }}", added=0, removed=2)


@pytest.mark.parametrize("explicit", [False, True], ids=["counted", "given-by-flag"])
def test_a_retired_instance_gives_back_its_share_of_the_resource_limit(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf, explicit: bool
) -> None:
    """Triton's QA `test_instance_resource_decrease`: it reads the limits from the verbose log."""
    needs = 'kind: KIND_CPU rate_limiter {{ resources [ {{ name: "R1" count: {} }} ] }}'
    counted.configure(f"{{ count: 1 {needs.format(4)} }}")
    flags = ["--rate-limit=execution_count", "--log-verbose=1"]
    server = start(*flags, *(["--rate-limit-resource=R1:10"] if explicit else []))
    _update(client_of(server), counted, f"{{ count: 1 {needs.format(3)} }}", added=1, removed=1)
    shown, never = ("10", "3") if explicit else ("3", "10")  # (the flag's count, or the most needed)
    wait_until(lambda: f"Resource: R1\\t Count: {shown}" in server.log, f"a limit of {shown} is logged")
    assert f"Resource: R1\\t Count: {never}" not in server.log


SEQUENCES = "sequence_batching { max_sequence_idle_microseconds: 8000000 }\n"


def _step(
    client: httpclient.InferenceServerClient, sequence_id: int, start: bool = False, end: bool = False
) -> int:
    tensor = httpclient.InferInput("IN", [1], "INT64")
    tensor.set_data_from_numpy(np.full([1], 3, np.int64))
    result = client.infer(
        "counted", [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end
    )
    return int(result.as_numpy("OUT").flat[0])


def test_under_sequence_batching_a_retired_instance_serves_its_sequences_until_they_end(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    """Triton's QA `_test_scheduler_update_with_ongoing_sequences`, with a CPU group unlike
    the first (its rate-limiter priority) where the QA has a GPU one."""
    counted.configure(_cpu(3), extra=SEQUENCES)
    server = start()
    client = client_of(server)
    assert _step(client, 1, start=True) == _step(client, 2, start=True) == 6
    # Every instance is retired: the one that holds no sequence before the load returns, the
    # two that hold sequences 1 and 2 once those end.
    counted.configure("{ count: 1 kind: KIND_CPU rate_limiter { priority: 2 } }", extra=SEQUENCES)
    client.load_model("counted")
    assert (counted.count("initialize"), counted.count("finalize")) == (4, 1)
    assert _step(client, 1) == _step(client, 2) == 6
    assert _step(client, 3, start=True) == 6  # on the new instance, the only one with a free slot
    assert counted.count("finalize") == 1
    _step(client, 1, end=True)
    _step(client, 2, end=True)
    wait_until(lambda: counted.count("finalize") == 3, "the retired instances are finalized")
    assert _step(client, 3, end=True) == 6
    assert "a retired instance stays until its 1 sequence(s) end" in server.log
    client.unload_model("counted")
    wait_until(lambda: counted.count("finalize") == 4, "every instance is finalized")


def test_under_sequence_batching_a_sequence_waiting_for_a_slot_takes_an_added_instance(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    counted.configure(_cpu(1), extra=SEQUENCES)
    server = start()
    client = client_of(server)
    assert _step(client, 1, start=True) == 6
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_step, client_of(server), 2, True, True)  # its one slot is sequence 1's
        counted.configure(_cpu(2), extra=SEQUENCES)
        client.load_model("counted")
        assert waiting.result(timeout=MAX_SECONDS) == 6
    assert (counted.count("initialize"), counted.count("finalize")) == (2, 0)
    assert _step(client, 1, end=True) == 6


def test_a_sequence_that_holds_a_retired_instance_is_cut_by_an_unload(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    counted.configure(_cpu(2), extra=SEQUENCES)
    client = client_of(start())
    _step(client, 1, start=True)
    _step(client, 2, start=True)
    counted.configure(_cpu(1), extra=SEQUENCES)
    client.load_model("counted")
    assert counted.count("finalize") == 0  # each instance holds a sequence
    client.unload_model("counted")
    wait_until(lambda: counted.count("finalize") == 2, "both instances are finalized")


def test_a_reload_that_fails_leaves_the_instances_as_they_were(
    counted: Counted, start: Callable[..., ServerProcess], client_of: ClientOf
) -> None:
    counted.configure(_cpu(1))
    client = client_of(start())
    (counted.model / "2").mkdir()
    failing = "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('version 2 never loads')\n"
    (counted.model / "2" / "model.py").write_text(failing)
    counted.configure(_cpu(3), extra="version_policy { all { } }\n")
    with pytest.raises(InferenceServerException, match="version 2 never loads"):
        client.load_model("counted")
    # Version 1's instances changed only once the others had loaded: none was added.
    assert (counted.count("initialize"), counted.count("finalize")) == (1, 0)
    assert _infer(client) == 6
