"""The configuration object that a model's `auto_complete_config` receives and completes."""

from __future__ import annotations

from typing import Any

from coreserve_python.pb_errors import TritonModelException


class ModelConfig:
    """The configuration that `auto_complete_config` receives and completes (a JSON-shaped dict)."""

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._config = model_config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def max_batch_size(self) -> int:
        return int(self._config.get("max_batch_size", 0))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if self.max_batch_size() and self.max_batch_size() != max_batch_size:
            raise TritonModelException(
                f"max_batch_size is already {self.max_batch_size()} in the configuration; "
                f"cannot set {max_batch_size}"
            )
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        if "sequence_batching" in self._config:
            raise TritonModelException(
                "the configuration uses sequence_batching; cannot add dynamic_batching"
            )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add_tensor("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        self._config.setdefault("model_transaction_policy", {}).update(transaction_policy_dict)

    def _add_tensor(self, kind: str, tensor: dict[str, Any]) -> None:
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise TritonModelException(f"add_{kind}() needs '{key}' in {tensor}")
        tensor = {**tensor, "dims": [int(d) for d in tensor["dims"]]}
        tensors = self._config.setdefault(kind, [])
        existing = next((entry for entry in tensors if entry.get("name") == tensor["name"]), None)
        if existing is None:
            tensors.append(tensor)
            return
        # The configuration file wins where it says something; auto-complete fills the rest.
        for key, value in tensor.items():
            current = existing.get(key)
            if current in (None, [], 0, "", "TYPE_INVALID"):
                existing[key] = value
            elif (list(map(int, current)) if key == "dims" else current) != value:
                raise TritonModelException(
                    f"{kind} '{tensor['name']}' has {key}={current!r} in the configuration, but "
                    f"auto_complete_config asks for {value!r}"
                )
