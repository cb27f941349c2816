"""The `python` backend: Triton Python models, each instance in a stub process of its own."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from coreserve import ModelConfig, ModelConfigError, config_from_dict, config_to_dict
from coreserve.backend import (
    BaseBackend,
    InstancePlacement,
    ModelFiles,
    ModelInstance,
    ServerContext,
    cuda_driver_gpus,
)
from coreserve_python.ipc import AutoCompleteMessage
from coreserve_python.server._instance import PythonInstance
from coreserve_python.server._process import run_once
from coreserve_python.server.env._build import Builds
from coreserve_python.server.env._environment import stub_launch

AUTO_COMPLETE_TIMEOUT_S = 120.0
FORCE_CPU_ONLY_INPUT_TENSORS = "FORCE_CPU_ONLY_INPUT_TENSORS"
# coreserve's parameters: how many executions a stub may be handed ahead (see PythonInstance),
# and how long an idle stub reads its socket without sleeping (see ipc.Channel.receive).
PIPELINE_DEPTH = "pipeline_depth"
DEFAULT_PIPELINE_DEPTH = 8
MAX_PIPELINE_DEPTH = 64
IDLE_SPIN_MICROSECONDS = "idle_spin_microseconds"
DEFAULT_IDLE_SPIN_MICROSECONDS = 200
MAX_IDLE_SPIN_MICROSECONDS = 10_000


def check_input_memory_parameter(config: ModelConfig) -> None:
    """FORCE_CPU_ONLY_INPUT_TENSORS takes "yes" or "no", as on Triton (its load error, stray quote
    included). Inputs reach a model in host memory with either: the server holds them there."""
    entry = config.parameters.get(FORCE_CPU_ONLY_INPUT_TENSORS)
    if entry is not None and entry.string_value not in ("yes", "no"):
        raise ModelConfigError(f"Incorrect value for {FORCE_CPU_ONLY_INPUT_TENSORS}: {entry.string_value}'")


def pipeline_depth(config: ModelConfig) -> int:
    """The `pipeline_depth` parameter: a whole number from 1 (no execution handed ahead) to 64."""
    return _whole_number(config, PIPELINE_DEPTH, DEFAULT_PIPELINE_DEPTH, 1, MAX_PIPELINE_DEPTH)


def idle_spin_microseconds(config: ModelConfig) -> int:
    """The `idle_spin_microseconds` parameter: from 0 (an idle stub sleeps at once) to 10,000."""
    return _whole_number(
        config, IDLE_SPIN_MICROSECONDS, DEFAULT_IDLE_SPIN_MICROSECONDS, 0, MAX_IDLE_SPIN_MICROSECONDS
    )


class SpinSlots:
    """How many stubs may spin while idle at once: one per two cores this process may use.

    A spinning stub holds a core while it looks for its next message (ipc.Channel.receive);
    more of them than that starve the server, clients on the same machine and each other
    (under load, two stubs spinning on two cores served far fewer requests than none).
    Claimed and released on the event loop.
    """

    def __init__(self, cores: int) -> None:
        self._free = max(1, cores // 2)

    def claim(self) -> bool:
        if self._free == 0:
            return False
        self._free -= 1
        return True

    def release(self) -> None:
        self._free += 1


SPIN_SLOTS = SpinSlots(len(os.sched_getaffinity(0)))


def _whole_number(config: ModelConfig, name: str, default: int, low: int, high: int) -> int:
    entry = config.parameters.get(name)
    if entry is None:
        return default
    text = entry.string_value.strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise ModelConfigError(f"parameter {name} must be a whole number from {low} to {high}, got '{text}'")
    return int(text)


class PythonBackend(BaseBackend):
    """Serves `model.py` files that define `TritonPythonModel`."""

    name: str = "python"
    platforms: tuple[str, ...] = ()
    default_model_filename: str = "model.py"
    # As Triton's: each instance is a stub process of its own, and what they share (a packed
    # environment's unpacking, a requirements build) is safe to begin from several at once.
    parallel_instance_loading: bool = True

    def __init__(self) -> None:
        self._builds = Builds()  # this server's environment builds

    def stop_loads(self) -> None:
        """The server stops: the environments being built for loads are given up, and no
        other begins."""
        self._builds.stop()

    def usable_gpus(self) -> Sequence[int]:
        """The GPUs the CUDA driver shows: as on Triton (whose python backend prefers GPU
        instances where there are GPUs), a model without instance_group gets an instance on
        each, and the model sees its kind and device in `args`; none here means CPU."""
        return cuda_driver_gpus()

    def auto_complete_config(
        self, model: ModelFiles, config: ModelConfig, server: ServerContext
    ) -> ModelConfig:
        """Runs the model's static `auto_complete_config(config)` in a short-lived stub."""
        self.check_model_file(model)
        message: AutoCompleteMessage = {
            "op": "auto_complete",
            "model_file": str(model.model_file),
            "backend_based": model.runtime is not None,
            "config": config_to_dict(config),
        }
        launch = stub_launch(config, model, server.backend_config, self._builds)
        reply = run_once(launch, message, "auto_complete_done", AUTO_COMPLETE_TIMEOUT_S)
        if reply["error"] is not None:
            raise ModelConfigError(f"model '{model.name}': auto_complete_config() failed:\n{reply['error']}")
        return config_from_dict(reply["config"], source=f"model '{model.name}' auto_complete_config()")

    async def create_instance(
        self, model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
    ) -> ModelInstance:
        self.check_model_file(model)
        check_input_memory_parameter(config)
        depth, spin = pipeline_depth(config), idle_spin_microseconds(config)
        spins = spin > 0 and SPIN_SLOTS.claim()  # else this instance's stub sleeps at once
        try:
            # Unpacking or building an environment takes seconds: not on the event loop.
            launch = await asyncio.to_thread(stub_launch, config, model, server.backend_config, self._builds)
            instance = PythonInstance(
                launch,
                model,
                config,
                placement,
                server,
                pipeline_depth=depth,
                idle_spin_microseconds=spin if spins else 0,
                on_close=SPIN_SLOTS.release if spins else None,
            )
            await instance.start()
        except BaseException:
            if spins:
                SPIN_SLOTS.release()
            raise
        return instance
