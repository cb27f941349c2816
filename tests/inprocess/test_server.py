"""coreserve.Server's life cycle and control: start, stop, explicit loading, metrics, frontends."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import tritonclient.http as httpclient

import coreserve
from support.model_builders import scale_model, write_model
from support.paths import REPO

SCALE = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
ECHO = """
backend: "echo"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


def _loop_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "coreserve-server"]


def test_stop_unloads_and_joins_the_loop_thread(repository: Path) -> None:
    before = len(_loop_threads())
    server = coreserve.Server(repository).start()
    assert server.live() and server.ready()
    assert len(_loop_threads()) == before + 1
    server.stop()
    assert len(_loop_threads()) == before
    assert not server.live() and not server.ready()
    server.stop()  # twice is fine
    with pytest.raises(RuntimeError, match="stopped"):
        server.model("add_sub")
    with pytest.raises(RuntimeError, match="cannot start again"):
        server.start()


def test_a_server_not_started_says_so(repository: Path) -> None:
    server = coreserve.Server(repository)
    with pytest.raises(RuntimeError, match="not started"):
        server.models()
    assert not server.ready()


def test_wrong_arguments_are_invalid_argument_errors(repository: Path) -> None:
    with pytest.raises(coreserve.InvalidArgumentError, match=r"unknown coreserve\.Server setting.*'no_such'"):
        coreserve.Server(repository, no_such=1)
    with pytest.raises(coreserve.InvalidArgumentError, match=r"unknown frontend.*'ftp'"):
        coreserve.Server(repository, frontends=["ftp"])
    with pytest.raises(coreserve.InvalidArgumentError, match="model_control_mode"):
        coreserve.Server(repository, model_control_mode="sometimes")
    with pytest.raises(coreserve.InvalidArgumentError, match="at least one model repository"):
        coreserve.Server()


def test_a_start_that_fails_raises_startup_error_and_leaves_no_thread(tmp_path: Path) -> None:
    before = len(_loop_threads())
    with pytest.raises(coreserve.StartupError, match="is not a folder"):
        coreserve.Server(tmp_path / "missing").start()
    write_model(tmp_path, "broken", b"not an onnx model", SCALE)
    with pytest.raises(coreserve.StartupError, match="failed to load"):
        coreserve.Server(tmp_path).start()
    assert len(_loop_threads()) == before
    # With exit_on_error off, the server starts and tells why the model is unavailable.
    with coreserve.Server(tmp_path, exit_on_error=False) as server:
        (entry,) = server.models()
        assert entry["name"] == "broken" and entry["state"] == "UNAVAILABLE" and entry["reason"]
        assert not server.ready()


def test_explicit_mode_loads_and_unloads_by_call(tmp_path: Path) -> None:
    write_model(tmp_path, "scale", scale_model(3.0), SCALE)
    with coreserve.Server(tmp_path, model_control_mode="explicit", load_models=["scale"]) as server:
        assert [(e["name"], e["state"]) for e in server.models(ready_only=True)] == [("scale", "READY")]
        model = server.model("scale")
        ones = {"INPUT0": np.ones((1, 4), np.float32)}
        np.testing.assert_array_equal(model.infer(ones).outputs["OUTPUT0"], [[3, 3, 3, 3]])
        server.unload("scale")
        assert not model.ready()
        with pytest.raises(coreserve.CoreserveError):
            model.infer(ones)
        server.load("scale")
        assert model.ready()
        assert model.config()["max_batch_size"] == 8
        config = model.config() | {"max_batch_size": 2}
        server.load("scale", config=config)
        assert model.config()["max_batch_size"] == 2
        with pytest.raises(coreserve.InvalidArgumentError, match="batch-size must be <= 2"):
            model.infer({"INPUT0": np.ones((3, 4), np.float32)})
        with pytest.raises(coreserve.CoreserveError, match="not in the repository"):
            server.load("absent")


def test_explicit_mode_refuses_control_in_none_mode(repository: Path, server: coreserve.Server) -> None:
    with pytest.raises(coreserve.CoreserveError, match="explicit"):
        server.unload("add_sub")
    assert server.model("add_sub").ready()


def test_metrics_and_statistics_count_in_process_requests(server: coreserve.Server) -> None:
    model = server.model("add_sub")
    before = model.statistics()["model_stats"][0]["inference_count"]
    model.infer({"INPUT0": np.zeros((3, 4), np.float32), "INPUT1": np.zeros((3, 4), np.float32)})
    stats = model.statistics()["model_stats"][0]
    assert stats["inference_count"] == before + 3
    text = server.metrics()
    assert f'nv_inference_count{{model="add_sub",version="1"}} {before + 3}' in text
    assert server.metadata()["name"] == "coreserve"
    assert model.metadata()["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}


def test_no_ports_are_opened_unless_asked(server: coreserve.Server) -> None:
    assert server.ports == {}


def test_frontends_asked_for_serve_the_same_models(repository: Path) -> None:
    loopback = {
        "http_address": "127.0.0.1",
        "http_port": 0,
        "metrics_address": "127.0.0.1",
        "metrics_port": 0,
    }
    with coreserve.Server(repository, frontends=["http", "metrics"], **loopback) as server:
        assert set(server.ports) == {"http", "metrics"}
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}")
        try:
            inputs = []
            for name in ("INPUT0", "INPUT1"):
                tensor = httpclient.InferInput(name, [1, 4], "FP32")
                tensor.set_data_from_numpy(np.ones((1, 4), np.float32), binary_data=True)
                inputs.append(tensor)
            answer = client.infer("add_sub", inputs)
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), [[2, 2, 2, 2]])
        finally:
            client.close()
        # The request over HTTP and the in-process view share one set of statistics.
        assert server.model("add_sub").statistics()["model_stats"][0]["inference_count"] >= 1


def test_blocking_calls_on_the_servers_own_loop_are_refused(server: coreserve.Server) -> None:
    async def on_the_server_loop() -> str:
        try:
            server.models()
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    loop = server._loop  # the test needs code that runs on the server's own loop thread
    assert loop is not None
    message = asyncio.run_coroutine_threadsafe(on_the_server_loop(), loop.loop).result(timeout=30)
    assert "async_" in message


def _echo_plugin() -> ModuleType:
    """The example echo backend (examples/backends/echo), imported from its folder (not installed)."""
    path = REPO / "examples" / "backends" / "echo" / "coreserve_echo" / "__init__.py"
    spec = importlib.util.spec_from_file_location("coreserve_echo", path, submodule_search_locations=[])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["coreserve_echo"] = module  # its own modules import coreserve_echo.backend
    spec.loader.exec_module(module)
    return module


def test_plugins_given_in_code_serve_and_parameters_reach_the_backend(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "echo", None, ECHO)
    (folder / "1" / "model.echo").write_bytes(b"")
    with coreserve.Server(tmp_path, plugins=[_echo_plugin()]) as server:
        result = server.model("echo").infer(
            {"IN": np.array([b"a", b"b"], dtype=object)}, parameters={"greeting": "hi", "n": 3, "on": True}
        )
        assert result.outputs["OUT"].tolist() == [b"a", b"b"]
        assert result.parameters == {"greeting": "hi", "n": 3, "on": True}
    with pytest.raises(coreserve.StartupError, match="failed to load"):
        coreserve.Server(tmp_path).start()  # without the plugin, no backend 'echo'
