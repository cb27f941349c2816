"""Builds the ONNX files of examples/model_repository (they are committed; run this to rebuild).

    python examples/build_example_models.py      # needs the `onnx` package

The weights are drawn from a fixed seed, so rebuilding gives the same files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPOSITORY = Path(__file__).resolve().parent / "model_repository"
OPSET = 17


def _save(graph: onnx.GraphProto, model_name: str) -> None:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="coreserve"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = REPOSITORY / model_name / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def simple() -> None:
    """Triton's `simple` example: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 [16])."""
    tensor = lambda name: helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 16])  # noqa: E731
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        [tensor("INPUT0"), tensor("INPUT1")],
        [tensor("OUTPUT0"), tensor("OUTPUT1")],
    )
    _save(graph, "simple")


def simple_string() -> None:
    """Triton's `simple_string`: the same sums over numbers written as strings (BYTES [16])."""
    tensor = lambda name: helper.make_tensor_value_info(name, TensorProto.STRING, ["batch", 16])  # noqa: E731
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Sub", ["a", "b"], ["difference"]),
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING),
        ],
        "simple_string",
        [tensor("INPUT0"), tensor("INPUT1")],
        [tensor("OUTPUT0"), tensor("OUTPUT1")],
    )
    _save(graph, "simple_string")


def text_classifier(vocabulary: int = 1000, width: int = 16) -> None:
    """A tiny text classifier shaped like Triton's: token ids and mask (INT64) -> logits FP32 [2].

    Mean of the token embeddings under the mask, then a dense layer.
    """
    rng = np.random.default_rng(7)
    embedding = numpy_helper.from_array(rng.normal(size=(vocabulary, width)).astype(np.float32), "embedding")
    weight = numpy_helper.from_array(rng.normal(size=(width, 2)).astype(np.float32), "weight")
    bias = numpy_helper.from_array(np.array([0.1, -0.1], dtype=np.float32), "bias")
    axis = numpy_helper.from_array(np.array([1], dtype=np.int64), "axis")
    one = numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["vectors"]),  # [B, T, W]
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),  # [B, T]
        helper.make_node("Unsqueeze", ["mask", "minus_one"], ["mask3"]),  # [B, T, 1]
        helper.make_node("Mul", ["vectors", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis"], ["total"], keepdims=0),  # [B, W]
        helper.make_node("ReduceSum", ["mask", "axis"], ["count"], keepdims=1),  # [B, 1]
        helper.make_node("Max", ["count", "one"], ["safe_count"]),
        helper.make_node("Div", ["total", "safe_count"], ["mean"]),
        helper.make_node("MatMul", ["mean", "weight"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["logits"]),
    ]
    minus_one = numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one")
    graph = helper.make_graph(
        nodes,
        "text_classifier",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        initializer=[embedding, weight, bias, axis, one, minus_one],
    )
    _save(graph, "text_classifier")


def dense_autocomplete() -> None:
    """A dense layer FP32 [N, 4] -> [N, 3] whose folder has no config.pbtxt: auto-complete fills it."""
    rng = np.random.default_rng(11)
    weight = numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "weight")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "weight"], ["scores"])],
        "dense_autocomplete",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3])],
        initializer=[weight],
    )
    _save(graph, "dense_autocomplete")


if __name__ == "__main__":
    simple()
    simple_string()
    text_classifier()
    dense_autocomplete()
