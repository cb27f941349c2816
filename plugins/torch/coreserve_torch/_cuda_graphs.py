"""CUDA graphs (parameter `coreserve_cuda_graphs`): each input shape captured once, then replayed.

A graph replays the kernels its capture recorded, on the memory they used then: each shape has
static input tensors (a request is copied into them) and the result its capture returned (read
out to host memory before the next replay overwrites it). The shapes are few: the load refuses
inputs with variable dimensions, so a batching model has one shape per batch size up to its
max_batch_size, and a model without batching has one.

All graph work on a GPU runs on one stream of its own, one instance at a time. A replay uses the
cuBLAS workspace its capture used, which torch keeps per thread handle and stream: graphs that
share one must not run at once, and a stream per instance would leave a workspace behind for
each instance a reload makes. Instances without graphs share a stream too (torch's default one).

The graphs of a GPU share one memory pool: a graph's intermediate tensors are only needed while
it replays, and replays never overlap, so the pool holds about what the largest graph needs
(plus each graph's inputs and result) rather than the sum over every batch size captured.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from coreserve import ModelConfig, ModelConfigError
from coreserve.backend import InstancePlacement, ModelSignature, bool_parameter

GRAPHS_PARAMETER = "coreserve_cuda_graphs"
# Calls before a capture, on the capture's stream, as PyTorch's docs do: lazy initialisations
# (cuBLAS handles and workspaces, TorchScript's profiling runs) must not happen while capturing.
WARM_UP_CALLS = 3
# torch allows one capture at a time in a process, and freeing GPU memory (which synchronises
# the GPU) must not happen during one.
_CAPTURING = threading.Lock()

Shapes = tuple[tuple[int, ...], ...]


def wants_cuda_graphs(
    config: ModelConfig, signature: ModelSignature, placement: InstancePlacement, device: torch.device
) -> bool:
    """Whether the configuration asks for CUDA graphs; ModelConfigError where they cannot work."""
    if not bool_parameter(config, GRAPHS_PARAMETER):
        return False
    model = config.name
    for spec in signature.model_inputs.values():
        if spec.name in signature.ragged_inputs:
            raise ModelConfigError(
                f"model '{model}': CUDA graphs need fixed shapes, and input '{spec.name}' allows ragged "
                f"batches (parameter {GRAPHS_PARAMETER})"
            )
        for field, shape in (("dims", spec.dims), ("reshape", spec.reshape or ())):
            if -1 in shape:
                raise ModelConfigError(
                    f"model '{model}': CUDA graphs need fixed shapes, and input '{spec.name}' has a "
                    f"variable dimension: {field} {list(shape)} (parameter {GRAPHS_PARAMETER})"
                )
    if device.type != "cuda":
        seen = "" if torch.cuda.is_available() else ", and this torch sees no CUDA device"
        raise ModelConfigError(
            f"model '{model}': CUDA graphs need the model on a GPU: instance '{placement.name}' is "
            f"KIND_{placement.kind}{seen} (parameter {GRAPHS_PARAMETER})"
        )
    return True


def first_batch(signature: ModelSignature) -> dict[str, np.ndarray]:
    """Zeros for every input, in the first shape the model meets: a batch of one, or its one shape."""
    lead = (1,) if signature.batching else ()
    return {
        name: np.zeros(
            lead + (spec.reshape if spec.reshape is not None else spec.dims), spec.datatype.numpy_dtype
        )
        for name, spec in signature.model_inputs.items()
    }


def empty_cache() -> None:
    """torch.cuda.empty_cache, between captures: gives what torch caches back to the GPU."""
    with _CAPTURING:
        torch.cuda.empty_cache()


@dataclass
class _GraphStream:
    """A GPU's stream for graphs, the lock that gives it to one instance at a time, and the
    memory pool its graphs share."""

    stream: torch.cuda.Stream
    lock: threading.Lock
    pool: Any


_STREAMS: dict[torch.device, _GraphStream] = {}
_STREAMS_LOCK = threading.Lock()


def _graph_stream(device: torch.device) -> _GraphStream:
    with _STREAMS_LOCK:
        if device not in _STREAMS:
            stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            with torch.cuda.device(device):
                _STREAMS[device] = _GraphStream(stream, threading.Lock(), torch.cuda.graph_pool_handle())
        return _STREAMS[device]


@dataclass
class _CapturedGraph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    result: Any  # what forward() returned during the capture: tensors the replays write


class CapturedGraphs:
    """One instance's CUDA graphs, by the shapes of forward()'s arguments.

    Each capture is logged as `<instance> captured a CUDA graph for inputs of shapes ...`.
    """

    def __init__(self, device: torch.device, logger: logging.Logger, instance: str) -> None:
        self._device = device
        self._stream = _graph_stream(device)
        self._logger = logger
        self._instance = instance
        self._graphs: dict[Shapes, _CapturedGraph] = {}

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """This GPU's graph stream, held: copy in, replay and read the result out inside it."""
        with self._stream.lock, torch.cuda.device(self._device), torch.cuda.stream(self._stream.stream):
            yield

    def replay(self, module: Any, arguments: Sequence[torch.Tensor]) -> Any:
        """forward()'s result for these host tensors, from the graph of their shapes (captured the
        first time they come). Call it inside `turn()`, and read the result before leaving."""
        shapes = tuple(tuple(argument.shape) for argument in arguments)
        captured = self._graphs.get(shapes)
        if captured is None:
            captured = self._graphs[shapes] = self._capture(module, arguments)
            self._logger.info(
                "%s captured a CUDA graph for inputs of shapes %s",
                self._instance,
                ", ".join(str(list(shape)) for shape in shapes),
            )
        for static, argument in zip(captured.inputs, arguments, strict=True):
            static.copy_(argument)
        captured.graph.replay()
        return captured.result

    def _capture(self, module: Any, arguments: Sequence[torch.Tensor]) -> _CapturedGraph:
        inputs = [argument.to(self._device) for argument in arguments]
        for _ in range(WARM_UP_CALLS):
            module(*inputs)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (other models on this GPU) may allocate while this captures.
        with (
            _CAPTURING,
            torch.cuda.graph(
                graph, pool=self._stream.pool, stream=self._stream.stream, capture_error_mode="thread_local"
            ),
        ):
            result = module(*inputs)
        return _CapturedGraph(graph, inputs, result)

    def clear(self) -> None:
        """Frees the graphs (what they held of the GPU's pool, torch.cuda.empty_cache gives back)."""
        with self._stream.lock:
            for captured in self._graphs.values():
                captured.graph.reset()
            self._graphs.clear()
