"""How configuration tensors meet a model's forward(): inputs to arguments, results to outputs."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from coreserve import InternalError, InvalidArgumentError, ModelConfigError
from coreserve_torch._tensors import to_array

_INDEXED = re.compile(r"^.*__(\d+)$")


def _indices(names: Sequence[str], *, every: bool = True) -> list[int] | None:
    """Positions from Triton's `<prefix>__<index>` names, if every name follows it; with
    `every`, only if they are 0, 1, … with none left out."""
    matches = [_INDEXED.match(name) for name in names]
    if not names or not all(matches):
        return None
    indices = [int(match.group(1)) for match in matches if match]
    return indices if not every or sorted(indices) == list(range(len(indices))) else None


class InputBinding:
    """Puts a request's arrays into forward()'s positional arguments."""

    def __init__(
        self, model_name: str, config_inputs: Sequence[str], forward_arguments: Sequence[str]
    ) -> None:
        if len(config_inputs) != len(forward_arguments):
            raise ModelConfigError(
                f"model '{model_name}': forward() takes {len(forward_arguments)} inputs "
                f"{list(forward_arguments)}, but the configuration lists {len(config_inputs)}: "
                f"{list(config_inputs)}"
            )
        indices = _indices(config_inputs)
        if indices is not None:
            self.order = [name for _, name in sorted(zip(indices, config_inputs, strict=True))]
        elif set(config_inputs) == set(forward_arguments):
            self.order = list(forward_arguments)
        else:
            self.order = list(config_inputs)

    def arguments(self, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        return [inputs[name] for name in self.order]


class OutputBinding:
    """Names forward()'s result: a tensor, a tuple or list, or a dict of tensors."""

    def __init__(self, model_name: str, config_outputs: Sequence[str]) -> None:
        self._model = model_name
        # As Triton's libtorch backend: outputs named `<name>__<index>` take that result of the
        # model's, whichever the configuration lists.
        indices = _indices(config_outputs, every=False)
        self._positions = (
            {name: index for index, name in zip(indices, config_outputs, strict=True)}
            if indices is not None
            else {name: index for index, name in enumerate(config_outputs)}
        )

    def outputs(self, result: Any, wanted: Sequence[str]) -> dict[str, np.ndarray]:
        if isinstance(result, torch.Tensor):
            result = (result,)
        if isinstance(result, Mapping):
            missing = [name for name in wanted if name not in result]
            if missing:
                raise InternalError(
                    f"model '{self._model}' returned a dict without {missing} (its keys: {sorted(result)})"
                )
            return {name: to_array(result[name]) for name in wanted}
        if isinstance(result, tuple | list):
            arrays = {}
            for name in wanted:
                position = self._positions[name]
                if position >= len(result):  # Triton's words (an invalid argument there)
                    raise InvalidArgumentError(
                        f"The output {name} in the model configuration refers to an output index which "
                        f"doesn't exist. This model has {len(result)} outputs"
                    )
                if not isinstance(result[position], torch.Tensor):
                    raise InternalError(
                        f"model '{self._model}' returned {len(result)} results; output '{name}' needs "
                        f"a tensor at position {position}"
                    )
                arrays[name] = to_array(result[position])
            return arrays
        raise InternalError(f"model '{self._model}' returned {type(result).__name__}, not tensors")
