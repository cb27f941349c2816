"""Loading TorchScript and torch.export files (imports torch: used only once a model loads)."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import torch

from coreserve import DataType, ModelConfig, ModelConfigError, UnavailableError
from coreserve.backend import (
    InstanceKind,
    InstancePlacement,
    InstanceThread,
    ModelFiles,
    ModelSignature,
    ModelTensor,
    ServerContext,
    bool_parameter,
    complete_config,
    default_max_batch_size,
    inline_below_us,
    int_parameter,
)
from coreserve_torch._binding import InputBinding, OutputBinding
from coreserve_torch._cuda_graphs import (
    GRAPHS_PARAMETER,
    CapturedGraphs,
    batch_sizes,
    largest_batch,
    wants_cuda_graphs,
)
from coreserve_torch._formats import is_export
from coreserve_torch._instance import TorchInstance
from coreserve_torch._tensors import TORCH_TYPES


def _dims(value: Any) -> tuple[int, ...]:
    return tuple(int(dim) if isinstance(dim, int) else -1 for dim in value.shape)


def _export_tensors(program: Any) -> tuple[list[ModelTensor], list[ModelTensor]]:
    """A torch.export program's user inputs and outputs (outputs named OUTPUT__<index>)."""
    names = list(program.graph_signature.user_inputs)
    placeholders = {
        node.name: node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder"
    }
    inputs = [
        ModelTensor(
            name,
            TORCH_TYPES.get(placeholders[name].dtype),
            _dims(placeholders[name]),
            str(placeholders[name].dtype),
        )
        for name in names
    ]
    output_node = next(node for node in program.graph.nodes if node.op == "output")
    values = output_node.meta.get("val")
    values = list(values) if isinstance(values, list | tuple) else [values]
    outputs = [
        ModelTensor(f"OUTPUT__{index}", TORCH_TYPES.get(value.dtype), _dims(value), str(value.dtype))
        for index, value in enumerate(values)
    ]
    return inputs, outputs


def _device(placement: InstancePlacement, model_name: str) -> torch.device:
    if placement.kind is not InstanceKind.GPU:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UnavailableError(
            f"model '{model_name}': instance '{placement.name}' is KIND_GPU, but this torch has no CUDA "
            "device (a CUDA build of torch and an NVIDIA GPU are needed)"
        )
    if placement.device_id >= torch.cuda.device_count():
        raise UnavailableError(
            f"model '{model_name}': GPU {placement.device_id} does not exist "
            f"({torch.cuda.device_count()} found)"
        )
    return torch.device(f"cuda:{placement.device_id}")


def _load(path: Path, device: torch.device, model_name: str) -> tuple[Any, list[str]]:
    """The callable module and its forward() argument names."""
    if not path.is_file():
        raise ModelConfigError(f"model '{model_name}': model file {path} not found")
    try:
        if is_export(path):
            program = torch.export.load(str(path))
            return program.module().to(device), list(program.graph_signature.user_inputs)
        module = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
    except Exception as exc:
        raise ModelConfigError(f"model '{model_name}': torch cannot load {path}: {exc}") from None
    module.eval()
    arguments = [argument.name for argument in module.forward.schema.arguments][1:]  # without self
    return module, arguments


def complete_from_export(model: ModelFiles, config: ModelConfig, server: ServerContext) -> ModelConfig:
    """Completes a configuration from a torch.export program's inputs and outputs."""
    try:
        program = torch.export.load(str(model.model_file))
    except Exception as exc:
        raise ModelConfigError(f"model '{model.name}': torch cannot load {model.model_file}: {exc}") from None
    inputs, outputs = _export_tensors(program)
    return complete_config(
        config,
        inputs,
        outputs,
        model_name=model.name,
        max_batch_size=default_max_batch_size(server, model.name),
    )


def create_instance(
    model: ModelFiles, config: ModelConfig, placement: InstancePlacement, server: ServerContext
) -> TorchInstance:
    """Loads the module for one instance (blocking: run it on a worker thread).

    Where the server loads several copies of the model (`server.copies`: one per worker) and
    the configuration sets no INTRA_OP_THREAD_COUNT, torch's threads are this process's share
    of the cores, not all of them: copies that each take every core slow one another down by
    far (docs/serving/workers.md).
    """
    device = _device(placement, model.name)
    intra = int_parameter(config, "INTRA_OP_THREAD_COUNT", minimum=1)
    if intra is None and server.copies > 1:
        intra = max(1, len(os.sched_getaffinity(0)) // server.copies)
        server.logger.info(
            "model '%s': %d torch thread(s), the share of %d copies of it on this machine's cores "
            "(parameter INTRA_OP_THREAD_COUNT sets it)",
            model.name,
            intra,
            server.copies,
        )
    if intra is not None:
        torch.set_num_threads(intra)
    inter = int_parameter(config, "INTER_OP_THREAD_COUNT", minimum=1)
    if inter is not None:
        with contextlib.suppress(RuntimeError):  # torch allows it once, before parallel work starts
            torch.set_num_interop_threads(inter)
    signature = ModelSignature(config)
    graphs = (
        CapturedGraphs(device, server.logger, f"model '{model.name}': instance '{placement.name}'")
        if wants_cuda_graphs(config, signature, placement, device)
        else None
    )
    module, arguments = _load(model.model_file, device, model.name)
    unsupported = [s.name for s in signature.model_inputs.values() if s.datatype is DataType.BYTES]
    if unsupported:
        raise ModelConfigError(
            f"model '{model.name}': plugin-torch cannot pass BYTES tensors ({unsupported})"
        )
    instance = TorchInstance(
        module,
        device,
        InputBinding(model.name, list(signature.model_inputs), arguments),
        OutputBinding(model.name, list(signature.model_outputs)),
        signature,
        # A replay is quick enough to run inline, but it waits for the GPU's graph stream, which
        # other instances hold: never on the event loop.
        InstanceThread(placement.name, 0 if graphs is not None else inline_below_us(config)),
        inference_mode=bool_parameter(config, "INFERENCE_MODE") is not False,
        optimized=not bool_parameter(config, "DISABLE_OPTIMIZED_EXECUTION"),
        graphs=graphs,
    )
    del module  # the instance holds the weights alone, so that its release frees them
    if graphs is not None:
        _capture_graphs(instance, signature, placement)
    return instance


def _capture_graphs(instance: TorchInstance, signature: ModelSignature, placement: InstancePlacement) -> None:
    """Captures every shape at load, so that a model CUDA cannot capture fails to load."""
    failure = None
    try:
        instance.capture_graphs(largest_batch(signature), batch_sizes(signature))
    except Exception as exc:
        failure = _failure(exc)
    # Released out of the except block: the exception's frames hold the module until it ends.
    if failure is not None:
        instance.release()
        raise ModelConfigError(
            f"model '{signature.model_name}': instance '{placement.name}' cannot run as a CUDA graph "
            f"(parameter {GRAPHS_PARAMETER}): a batch of zeros failed: {failure}"
        )


_INTERPRETER = "The following operation failed in the TorchScript interpreter."
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


def _summary(exc: BaseException) -> str:
    """`<type>: <first line>`; for TorchScript's interpreter, the error its traceback ends with."""
    lines = str(exc).strip().splitlines()
    if lines and lines[0].startswith(_INTERPRETER):
        raised = next((line for line in lines[1:] if _RAISED.match(line)), None)
        if raised is not None:
            return raised
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _failure(exc: BaseException) -> str:
    """The root cause first, then the error it led to: torch's capture ends with "operation
    failed due to a previous error during capture", which names nothing of that error."""
    root, seen = exc, {id(exc)}
    while (inner := root.__cause__ or root.__context__) is not None and id(inner) not in seen:
        root = inner
        seen.add(id(root))
    return _summary(exc) if root is exc else f"{_summary(root)} (then: {_summary(exc)})"
