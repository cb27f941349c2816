"""Checking a model configuration against the ONNX model it describes."""

from __future__ import annotations

from coreserve import DataType, ModelConfigError, UnsupportedError
from coreserve.backend import ModelSignature, TensorSpec
from coreserve_onnx.tensors import OnnxTensor


def check_signature(
    signature: ModelSignature, inputs: dict[str, OnnxTensor], outputs: dict[str, OnnxTensor]
) -> None:
    """Raises ModelConfigError naming the tensor when the configuration and the model disagree."""
    model = signature.model_name
    for kind, specs, tensors in (
        ("input", signature.model_inputs, inputs),
        ("output", signature.model_outputs, outputs),
    ):
        for spec in specs.values():
            tensor = tensors.get(spec.name)
            if tensor is None:
                raise ModelConfigError(
                    f"model '{model}': configuration {kind} '{spec.name}' is not an {kind} of the ONNX model "
                    f"(its {kind}s: {sorted(tensors)})"
                )
            _check_tensor(signature, kind, spec, tensor)
    missing = [name for name in inputs if name not in signature.model_inputs]
    if missing:
        raise ModelConfigError(
            f"model '{model}': the ONNX model needs input(s) {missing} that the configuration does not list"
        )


def _check_tensor(signature: ModelSignature, kind: str, spec: TensorSpec, tensor: OnnxTensor) -> None:
    model = signature.model_name
    where = f"model '{model}', {kind} '{spec.name}'"
    if tensor.datatype is None:
        raise ModelConfigError(f"{where}: the ONNX model's type {tensor.ort_type} cannot be served")
    if tensor.datatype is DataType.BF16:
        raise UnsupportedError(f"{where}: onnxruntime's Python API cannot exchange BF16 tensors")
    if tensor.datatype is not spec.datatype:
        raise ModelConfigError(
            f"{where}: the configuration says {spec.datatype}, the ONNX model has {tensor.datatype}"
        )
    dims = list(spec.reshape if spec.reshape is not None else spec.dims)
    expected = [-1, *dims] if signature.batching else dims
    actual = list(tensor.dims)
    if signature.batching and (not actual or actual[0] != -1):
        raise ModelConfigError(
            f"{where}: max_batch_size is {signature.max_batch_size}, so the ONNX model's first dimension "
            f"must be dynamic, but its shape is {actual}"
        )
    if len(actual) != len(expected) or any(
        model_dim != -1 and model_dim != config_dim
        for model_dim, config_dim in zip(actual, expected, strict=True)
    ):
        raise ModelConfigError(
            f"{where}: the configuration's shape {expected} does not fit the ONNX model's shape {actual}"
        )
