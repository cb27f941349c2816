"""What a client asked of a request's outputs beyond their names: how each one goes back.

Every transport decodes a request into an `InferenceRequest` (what the model computes, the
requested outputs and their class counts among it) and an `OutputPlan` (how the answer is sent:
binary data or JSON over HTTP, or written into a shared memory region over either transport).
The frontend keeps the plan while the model runs and hands it to the response's encoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coreserve.protocol._shared_memory import OutputInSharedMemory


@dataclass(slots=True)
class OutputPlan:
    """How each output goes back: binary or JSON (HTTP only: gRPC sends raw bytes), or into the
    shared memory region resolved when the request was decoded (so that unregistering the
    region while the model runs is harmless)."""

    binary_by_default: bool = False
    binary: dict[str, bool] = field(default_factory=dict)
    shared_memory: dict[str, OutputInSharedMemory] = field(default_factory=dict)

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.binary_by_default)


# The plan of a request that asks nothing of its outputs over gRPC; never changed.
DEFAULT_PLAN = OutputPlan()
