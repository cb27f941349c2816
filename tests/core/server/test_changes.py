"""The changes a client makes to the server (`coreserve.server.changes`): each travels as a
message and comes back as it was; what is no change, or a malformed one, is refused."""

from __future__ import annotations

import orjson
import pytest

from coreserve.errors import InvalidArgumentError
from coreserve.server.changes import (
    Change,
    LoadModel,
    RegisterCudaRegion,
    RegisterSystemRegion,
    UnloadModel,
    UnregisterCudaRegion,
    UnregisterSystemRegion,
    UpdateLogSettings,
    UpdateTraceSetting,
    change_from,
    message_of,
)

CHANGES = [
    LoadModel("add", {"config": '{"max_batch_size": 4}'}),
    UnloadModel("add", dependents=True),
    RegisterSystemRegion("input", "/shm-key", 16, 4096),
    UnregisterSystemRegion(""),
    RegisterCudaRegion("output", b"\x00\x01handle", 1, 1024),
    UnregisterCudaRegion("output"),
    UpdateLogSettings({"log_verbose_level": 1}),
    UpdateTraceSetting({"trace_rate": "10"}, "add"),
]


@pytest.mark.parametrize("change", CHANGES, ids=lambda change: change.call)
def test_a_change_comes_back_from_its_message(change: Change) -> None:
    message = message_of(change)
    assert message["call"] == change.call
    assert change_from(message) == change
    if not isinstance(change, RegisterCudaRegion):  # (bytes travel as base64 between workers)
        assert change_from(orjson.loads(orjson.dumps(message))) == change


def test_what_a_change_replaces_and_what_an_unregistration_forgets() -> None:
    assert LoadModel("add", {}).replay_key == UnloadModel("add").replay_key == ("model", "add")
    assert RegisterSystemRegion("a", "/k", 0, 8).undo() == UnregisterSystemRegion("a")
    assert UnregisterSystemRegion("a").forgets(("system", "a"))
    assert not UnregisterSystemRegion("a").forgets(("system", "b"))
    assert not UnregisterSystemRegion("a").forgets(("cuda", "a"))
    assert UnregisterSystemRegion("").forgets(("system", "b"))  # every region
    assert UnregisterCudaRegion("").forgets(("cuda", "x")) and not UnregisterCudaRegion("").forgets(
        ("model", "x")
    )


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ({"call": "reboot"}, "no such change: 'reboot'"),
        ({}, "no such change: 'None'"),
        ({"call": 3}, "no such change: '3'"),
        ({"call": "load_model", "name": "add"}, "change 'load_model' is malformed"),
        ({"call": "unload_model", "name": "add", "force": True}, "change 'unload_model' is malformed"),
    ],
)
def test_what_is_no_change_is_refused(message: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        change_from(message)
