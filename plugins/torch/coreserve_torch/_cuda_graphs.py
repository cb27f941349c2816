"""CUDA graphs (parameter `coreserve_cuda_graphs`): every input shape captured at load, then replayed.

A graph replays the kernels its capture recorded, on the memory they used then. The shapes are
few: the load refuses inputs with variable dimensions, so a batching model has one shape per
batch size up to its max_batch_size, and a model without batching has one. The load captures
them all, so no request ever waits for a capture (which synchronises the GPU and holds every
other capture of the process), a model CUDA cannot capture fails to load, and the GPU memory the
load measures includes the graphs'.

Every graph of an instance reads its inputs from the leading rows of one static tensor per input,
of the largest batch's shape (a request is copied in), and keeps the result its capture returned
(read out to host memory before the next replay can overwrite it).

All graph work on a GPU runs on one stream of its own, one instance at a time. A replay uses the
cuBLAS workspace its capture used, which torch keeps per thread handle and stream: graphs that
share one must not run at once, and a stream per instance would leave a workspace behind for
each instance a reload makes. Instances without graphs share a stream too (torch's default one).

An instance's graphs share one memory pool, the instance's own. A graph's intermediate tensors
are needed only while it replays, and replays never overlap, so the largest batch is captured
first and the smaller ones reuse its blocks: the pool holds about what the largest graph needs,
plus each graph's result. A result may lie where another graph computes in between, which is
why it is read before the next replay. An unload frees the pool, whatever other models keep.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from coreserve import InternalError, ModelConfig, ModelConfigError
from coreserve.backend import InstancePlacement, ModelSignature, bool_parameter

GRAPHS_PARAMETER = "coreserve_cuda_graphs"
# Calls before each capture, on the capture's stream, as PyTorch's docs do: lazy initialisations
# (cuBLAS handles and workspaces, TorchScript's profiling runs for a new shape) must not happen
# while capturing.
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


def largest_batch(signature: ModelSignature) -> dict[str, np.ndarray]:
    """Zeros for every input in the largest shape the model meets: a batch of max_batch_size, or
    its one shape."""
    lead = (signature.max_batch_size,) if signature.batching else ()
    return {
        name: np.zeros(
            lead + (spec.reshape if spec.reshape is not None else spec.dims), spec.datatype.numpy_dtype
        )
        for name, spec in signature.model_inputs.items()
    }


def batch_sizes(signature: ModelSignature) -> list[int] | None:
    """The batch sizes to capture, largest first; None for a model without batching."""
    return list(range(signature.max_batch_size, 0, -1)) if signature.batching else None


def empty_cache() -> None:
    """torch.cuda.empty_cache, between captures: gives what torch caches back to the GPU."""
    with _CAPTURING:
        torch.cuda.empty_cache()


@dataclass
class _GraphStream:
    """A GPU's stream for graphs, and the lock that gives it to one instance at a time."""

    stream: torch.cuda.Stream
    lock: threading.Lock


_STREAMS: dict[torch.device, _GraphStream] = {}
_STREAMS_LOCK = threading.Lock()


def _graph_stream(device: torch.device) -> _GraphStream:
    with _STREAMS_LOCK:
        if device not in _STREAMS:
            stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            _STREAMS[device] = _GraphStream(stream, threading.Lock())
        return _STREAMS[device]


@dataclass
class _CapturedGraph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # views of the instance's static inputs
    result: Any  # what forward() returned during the capture: tensors the replays write


class CapturedGraphs:
    """One instance's CUDA graphs, by the shapes of forward()'s arguments, and their memory pool.

    `capture` makes them all at load and logs one line for them:
    `<instance> captured <n> CUDA graph(s) (<shapes>) in <seconds> s`.
    """

    def __init__(self, device: torch.device, logger: logging.Logger, instance: str) -> None:
        self._device = device
        self._stream = _graph_stream(device)
        self._logger = logger
        self._instance = instance
        with torch.cuda.device(device):
            self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[Shapes, _CapturedGraph] = {}
        self._static: list[torch.Tensor] = []

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """This GPU's graph stream, held: copy in, replay and read the result out inside it."""
        with self._stream.lock, torch.cuda.device(self._device), torch.cuda.stream(self._stream.stream):
            yield

    def capture(self, module: Any, largest: Sequence[torch.Tensor], sizes: Sequence[int] | None) -> None:
        """Captures forward() on the leading `sizes` rows of `largest` (host tensors), in this
        order, or on `largest` as it is where `sizes` is None (a model without batching).

        Blocking, at load: each capture holds the GPU's graph stream, and gives it back between
        captures so that the other instances on the GPU serve meanwhile.
        """
        started = time.monotonic()
        with self.turn():
            self._static = [argument.to(self._device) for argument in largest]
        for size in sizes if sizes is not None else [None]:
            inputs = [static if size is None else static[:size] for static in self._static]
            with self.turn():
                captured = self._capture(module, inputs)
            self._graphs[_shapes(inputs)] = captured
        empty_cache()  # what the warm-up calls left in torch's cache is not the graphs'
        what = (
            f"inputs of shapes {', '.join(str(list(shape)) for shape in next(iter(self._graphs)))}"
            if sizes is None
            else f"batch sizes 1 to {max(sizes)}"
        )
        count = len(self._graphs)
        self._logger.info(
            "%s captured %d CUDA graph%s (%s) in %.1f s",
            self._instance,
            count,
            "" if count == 1 else "s",
            what,
            time.monotonic() - started,
        )

    def _capture(self, module: Any, inputs: Sequence[torch.Tensor]) -> _CapturedGraph:
        for _ in range(WARM_UP_CALLS):
            module(*inputs)
        graph = torch.cuda.CUDAGraph()
        began = False
        try:
            # thread_local: other threads (other models on this GPU) may allocate while this captures.
            with (
                _CAPTURING,
                torch.cuda.graph(
                    graph, pool=self._pool, stream=self._stream.stream, capture_error_mode="thread_local"
                ),
            ):
                began = True
                result = module(*inputs)
        except BaseException:
            if began and not _ended(graph):
                _forget_failed_capture(self._device, self._pool)
            raise
        return _CapturedGraph(graph, list(inputs), result)

    def replay(self, arguments: Sequence[torch.Tensor]) -> Any:
        """forward()'s result for these host tensors, from the graph of their shapes. Call it
        inside `turn()`, and read the result before leaving."""
        shapes = _shapes(arguments)
        captured = self._graphs.get(shapes)
        if captured is None:  # the load captured every shape a checked request can have
            raise InternalError(
                f"{self._instance} has no CUDA graph for inputs of shapes "
                f"{', '.join(str(list(shape)) for shape in shapes)} (parameter {GRAPHS_PARAMETER})"
            )
        for static, argument in zip(captured.inputs, arguments, strict=True):
            static.copy_(argument)
        captured.graph.replay()
        return captured.result

    def clear(self) -> None:
        """Frees the graphs and their inputs (the pool, torch.cuda.empty_cache gives back)."""
        with self._stream.lock:
            for captured in self._graphs.values():
                captured.graph.reset()
            self._graphs.clear()
            self._static = []


def _shapes(tensors: Sequence[torch.Tensor]) -> Shapes:
    return tuple(tuple(tensor.shape) for tensor in tensors)


def _ended(graph: torch.cuda.CUDAGraph) -> bool:
    """Whether the graph's capture ended (torch gives its pool only after a successful one)."""
    try:
        graph.pool()
    except RuntimeError:
        return False
    return True


def _forget_failed_capture(device: torch.device, pool: Any) -> None:
    """Undoes what torch leaves behind when a capture fails to end (the model did something a
    capture cannot hold): its hold on the pool, which would keep the pool's memory for good, and
    (in the torch versions that end it after the capture) the pool's routing of allocations."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with contextlib.suppress(RuntimeError):  # torch ended the routing before the capture failed
        torch._C._cuda_endAllocateToPool(index, pool)
    with contextlib.suppress(RuntimeError):  # a torch that let go of the pool itself refuses
        torch._C._cuda_releasePool(index, pool)
