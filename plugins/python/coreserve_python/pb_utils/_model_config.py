"""The configuration object that a model's `auto_complete_config` receives and completes.

It behaves as Triton 2.51's `ModelConfig`: the same checks, raising ValueError with Triton's
texts, so an `auto_complete_config` that works on Triton works here, and fails here where it
fails there.
"""

from __future__ import annotations

import json
from typing import Any

_INPUT_PROPERTIES = ("name", "data_type", "dims", "optional")
_OUTPUT_PROPERTIES = ("name", "data_type", "dims")


class ModelConfig:
    """The configuration that `auto_complete_config` receives and completes.

    :param model_config: the configuration as a JSON string (as Triton's stub passes it) or as
        the dict it decodes to.
    """

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        self._model_config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, str | bytes) else model_config
        )

    def as_dict(self) -> dict[str, Any]:
        """The configuration, as a dict (changes made to it are kept)."""
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Sets max_batch_size; ValueError if the configuration already sets a larger one."""
        configured = self._model_config.get("max_batch_size", 0)
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Adds dynamic_batching unless there is one; ValueError if another scheduler is set."""
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        """Adds an input, or completes the configuration's input of that name."""
        self._add_tensor("input", input, _INPUT_PROPERTIES)

    def add_output(self, output: dict[str, Any]) -> None:
        """Adds an output, or completes the configuration's output of that name."""
        self._add_tensor("output", output, _OUTPUT_PROPERTIES)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Sets `model_transaction_policy` (only `decoupled`); ValueError on a conflict."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name()}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._name()
        label = f"{kind} '{tensor.get('name')}'"
        if any(key not in allowed for key in tensor):
            names = ", ".join(f"'{key}'" for key in allowed[:-1]) + f" and '{allowed[-1]}'"
            raise ValueError(
                f"{label} in auto-complete-config function for model '{model}' contains property "
                f"other than {names}."
            )
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{model}' is missing 'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{label} in auto-complete-config function for model '{model}' is missing "
                    f"'{key}' property."
                )
        tensors = self._model_config.setdefault(kind, [])
        current = next((entry for entry in tensors if entry.get("name") == tensor["name"]), None)
        if current is None:
            tensors.append(tensor)
            return
        name = tensor["name"]
        configured_type = current.get("data_type", "TYPE_INVALID")
        if configured_type != "TYPE_INVALID" and configured_type != tensor["data_type"]:
            raise ValueError(
                f"unable to load model '{model}', configuration expects datatype {configured_type} "
                f"for {kind} '{name}', model provides {tensor['data_type']}"
            )
        if current.get("dims") and current["dims"] != tensor["dims"]:
            raise ValueError(
                f"model '{model}', tensor '{name}': the model expects dims {tensor['dims']} but the "
                f"model configuration specifies dims {current['dims']}"
            )
        if (
            kind == "input"
            and "optional" in current
            and "optional" in tensor
            and current["optional"] != tensor["optional"]
        ):
            raise ValueError(
                f"model '{model}', tensor '{name}': the model expects optional "
                f"{tensor['optional']} but the model configuration specifies optional "
                f"{current['optional']}"
            )
        current["data_type"] = tensor["data_type"]
        current["dims"] = tensor["dims"]
        if "optional" in tensor:
            current["optional"] = tensor["optional"]
