"""The models the benchmarks serve: ONNX graphs (an MLP, an identity), written into a model
repository, the coreserve process that serves it, and an HTTP request body for them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from coreserve.testing import ServerProcess


def mlp_weights(width_in: int, width: int, layers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight [fan_in, width], bias [width]) per dense layer, the same on every call."""
    rng = np.random.default_rng(0)
    weights = []
    for layer in range(layers):
        fan_in = width_in if layer == 0 else width
        weight = rng.normal(0, fan_in**-0.5, size=(fan_in, width)).astype(np.float32)
        weights.append((weight, rng.normal(0, 0.1, size=width).astype(np.float32)))
    return weights


def mlp_onnx(weights: Sequence[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """An ONNX MLP `x` [N, fan_in] -> `y` [N, width]: Gemm and ReLU per layer."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, initializers, current = [], [], "x"
    for layer, (weight, bias) in enumerate(weights):
        initializers += [
            numpy_helper.from_array(weight, f"w{layer}"),
            numpy_helper.from_array(bias, f"b{layer}"),
        ]
        output = "y" if layer == len(weights) - 1 else f"r{layer}"
        nodes += [
            helper.make_node("Gemm", [current, f"w{layer}", f"b{layer}"], [f"h{layer}"]),
            helper.make_node("Relu", [f"h{layer}"], [output]),
        ]
        current = output
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", weights[0][0].shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", weights[-1][0].shape[1]])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def identity_onnx(dims: Sequence[str | int] = ("n",)) -> bytes:
    """An ONNX model whose OUTPUT0 is its FP32 INPUT0 of `dims` (names for any size)."""
    from onnx import TensorProto, ValueInfoProto, helper

    def info(name: str) -> ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))

    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [info("INPUT0")],
        [info("OUTPUT0")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def write_model(repository: Path, name: str, model_bytes: bytes, config: str) -> None:
    (repository / name / "1").mkdir(parents=True, exist_ok=True)
    (repository / name / "config.pbtxt").write_text(config)
    (repository / name / "1" / "model.onnx").write_bytes(model_bytes)


def start_server(repository: Path, *args: str) -> ServerProcess:
    """A coreserve process on free loopback ports (see coreserve.testing.ServerProcess)."""
    return ServerProcess([repository], ["--log-verbose=0", *args]).start(timeout=120)


def binary_infer_body(input_name: str, array: np.ndarray, output_name: str) -> tuple[bytes, dict[str, str]]:
    """An HTTP infer body with one FP32 input and one output, both as binary tensor data."""
    data = np.ascontiguousarray(array, dtype=np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": input_name,
                    "shape": list(data.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": output_name, "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + data.tobytes(), {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
