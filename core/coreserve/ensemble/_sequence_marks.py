"""The sequence id and flags an ensemble's tensors carry, as Triton's ensemble keeps them.

Every tensor a step produces is marked with the sequence id and the start and end flags of the
step's request, or with those the step's response gave as its parameters `sequence_id`,
`sequence_start`, `sequence_end` (a model that starts or ends a sequence for the steps after
it). A step's request takes the mark of its inputs (the ensemble request's where none of them
is marked), and every response of the ensemble says its outputs' mark in those three
parameters, as Triton 2.51's does (`sequence_id` 0 and both flags false for a request outside
any sequence).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coreserve.errors import InvalidArgumentError
from coreserve.types import ParameterValue

logger = logging.getLogger(__name__)

SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


@dataclass(frozen=True)
class SequenceMark:
    sequence_id: int | str
    start: bool
    end: bool

    @classmethod
    def of_request(cls, parameters: Mapping[str, ParameterValue]) -> SequenceMark:
        sequence_id = parameters.get("sequence_id", 0)
        return cls(
            sequence_id if isinstance(sequence_id, int | str) and not isinstance(sequence_id, bool) else 0,
            parameters.get("sequence_start") is True,
            parameters.get("sequence_end") is True,
        )

    def after(self, response: Mapping[str, ParameterValue]) -> SequenceMark:
        """The mark of a step's outputs: this one (its request's), unless the step's response
        sets one of the sequence parameters; then its flags are those it sets, in Triton's words
        where one has the wrong type."""
        if not any(name in response for name in SEQUENCE_PARAMETERS):
            return self
        sequence_id = response.get("sequence_id", self.sequence_id)
        if isinstance(sequence_id, bool) or not isinstance(sequence_id, int | str):
            raise InvalidArgumentError(
                "expected parameter 'sequence_id' to be TRITONSERVER_PARAMETER_INT or "
                "TRITONSERVER_PARAMETER_STRING"
            )
        flags = []
        for name in ("sequence_start", "sequence_end"):
            value = response.get(name, False)
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"expect parameter '{name}' to be TRITONSERVER_PARAMETER_BOOL")
            flags.append(value)
        return SequenceMark(sequence_id, *flags)

    def parameters(self) -> dict[str, ParameterValue]:
        """This mark as response or request parameters."""
        return {"sequence_id": self.sequence_id, "sequence_start": self.start, "sequence_end": self.end}


def step_mark(ensemble: SequenceMark, inputs: Iterable[SequenceMark | None], model_name: str) -> SequenceMark:
    """The mark of a step's request: that of its first marked input, in the order `inputs` come
    (Triton's order is its map's; it logs an error where its inputs' marks differ, and keeps
    one), or the ensemble request's where none is marked."""
    marks = [mark for mark in inputs if mark is not None]
    if not marks:
        return ensemble
    chosen = marks[0]
    if any(mark != chosen for mark in marks):
        logger.error(
            "Different set of response parameters are set for '%s'. Parameter correlation ID %s, "
            "sequence start %s, sequence end %s is used.",
            model_name,
            chosen.sequence_id,
            chosen.start,
            chosen.end,
        )
    return chosen
