"""Reading SavedModels and frozen GraphDefs into one callable and the tensors it takes and gives.

Imported when a model loads, not when the plugin registers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreserve import ModelConfig, ModelConfigError
from coreserve.backend import ModelTensor, str_parameter
from coreserve_tensorflow._runtime import TF_TYPES, tf, type_name

DEFAULT_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class TensorFlowModel:
    """A loaded model: `run(inputs)` maps input names to tensors and returns output name ->
    tensor; `inputs`/`outputs` describe them (dims None where TensorFlow does not know the
    rank); `owner` keeps what the callable needs alive."""

    run: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    inputs: dict[str, tuple[Any, tuple[int, ...] | None]]
    outputs: dict[str, tuple[Any, tuple[int, ...] | None]]
    owner: Any = None

    def model_tensors(self, which: str) -> dict[str, ModelTensor]:
        """The inputs or outputs as ModelTensors (dims () where the rank is unknown)."""
        specs = self.inputs if which == "input" else self.outputs
        return {
            name: ModelTensor(name, TF_TYPES.get(dtype), dims or (), type_name(dtype))
            for name, (dtype, dims) in specs.items()
        }


def _dims(shape: Any) -> tuple[int, ...] | None:
    if shape.rank is None:
        return None
    return tuple(-1 if dim is None else int(dim) for dim in shape.as_list())


def load_savedmodel(path: Path, config: ModelConfig, model_name: str) -> TensorFlowModel:
    """The signature TF_SIGNATURE_DEF (default serving_default) of the SavedModel's TF_GRAPH_TAG
    (default serve) graph; raises ModelConfigError saying why it cannot."""
    tag = str_parameter(config, "TF_GRAPH_TAG") or DEFAULT_TAG
    signature = str_parameter(config, "TF_SIGNATURE_DEF") or DEFAULT_SIGNATURE
    if not path.is_dir():
        raise ModelConfigError(f"model '{model_name}': SavedModel folder {path} not found")
    try:
        loaded = tf.saved_model.load(str(path), tags=[tag])
    except Exception as exc:  # TensorFlow raises errors of many kinds here
        raise ModelConfigError(
            f"model '{model_name}': TensorFlow cannot load the SavedModel {path} with tag '{tag}': "
            f"{_first_line(exc)}"
        ) from None
    functions = loaded.signatures
    if signature not in functions:
        raise ModelConfigError(
            f"model '{model_name}': the SavedModel has no signature '{signature}' "
            f"(its signatures: {sorted(functions)}); set parameter TF_SIGNATURE_DEF"
        )
    function = functions[signature]
    inputs = {
        name: (spec.dtype, _dims(spec.shape)) for name, spec in function.structured_input_signature[1].items()
    }
    outputs = {name: (spec.dtype, _dims(spec.shape)) for name, spec in function.structured_outputs.items()}

    def run(feeds: Mapping[str, Any]) -> Mapping[str, Any]:
        return function(**feeds)  # type: ignore[no-any-return]

    return TensorFlowModel(run, inputs, outputs, owner=loaded)


def load_graphdef(path: Path, config: ModelConfig, model_name: str) -> TensorFlowModel:
    """A frozen GraphDef fed and fetched by the configuration's tensor names (`name` or
    `name:0`); raises ModelConfigError saying why it cannot."""
    if not path.is_file():
        raise ModelConfigError(f"model '{model_name}': GraphDef file {path} not found")
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(path.read_bytes())
        wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
    except Exception as exc:
        raise ModelConfigError(
            f"model '{model_name}': TensorFlow cannot read {path} as a GraphDef: {_first_line(exc)}"
        ) from None
    graph = wrapped.graph
    tensors = {}
    for kind, names in (
        ("input", [i.name for i in config.input]),
        ("output", [o.name for o in config.output]),
    ):
        for name in names:
            try:
                tensors[name] = graph.get_tensor_by_name(name if ":" in name else f"{name}:0")
            except (KeyError, ValueError):
                raise ModelConfigError(
                    f"model '{model_name}': configuration {kind} '{name}' is not a tensor of the GraphDef"
                ) from None
    input_names = [i.name for i in config.input]
    output_names = [o.name for o in config.output]
    pruned = wrapped.prune(
        feeds=[tensors[name] for name in input_names], fetches={name: tensors[name] for name in output_names}
    )

    def run(feeds: Mapping[str, Any]) -> Mapping[str, Any]:
        return pruned(*(feeds[name] for name in input_names))  # type: ignore[no-any-return]

    return TensorFlowModel(
        run,
        {name: (tensors[name].dtype, _dims(tensors[name].shape)) for name in input_names},
        {name: (tensors[name].dtype, _dims(tensors[name].shape)) for name in output_names},
        owner=wrapped,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
