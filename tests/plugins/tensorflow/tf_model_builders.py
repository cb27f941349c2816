"""Builds the SavedModels and the frozen GraphDef of the TensorFlow tests with TensorFlow itself.

Run as a script in a process of its own (`python tf_model_builders.py FOLDER`): importing
TensorFlow into the test process would cost it seconds and bring TensorFlow's warnings in.
Each model goes to FOLDER/<name>/1/model.savedmodel (or model.graphdef).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

# Datatypes TensorFlow and the protocol share, by the name the identity model's tensors carry.
IDENTITY_TYPES = {
    "BOOL": tf.bool,
    "UINT8": tf.uint8,
    "UINT16": tf.uint16,
    "UINT32": tf.uint32,
    "UINT64": tf.uint64,
    "INT8": tf.int8,
    "INT16": tf.int16,
    "INT32": tf.int32,
    "INT64": tf.int64,
    "FP16": tf.float16,
    "FP32": tf.float32,
    "FP64": tf.float64,
    "BF16": tf.bfloat16,
    "BYTES": tf.string,
}


def _folder(root: Path, name: str) -> Path:
    folder = root / name / "1"
    folder.mkdir(parents=True)
    return folder


def affine_and_strings(root: Path) -> None:
    """y = 2x + 1 (FP32 [N,4]); n = length(s) (INT32 [N]); u = upper(s) (BYTES [N])."""

    class Model(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 4], tf.float32, name="x"),
                tf.TensorSpec([None], tf.string, name="s"),
            ]
        )
        def serve(self, x: tf.Tensor, s: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": 2.0 * x + 1.0, "n": tf.strings.length(s), "u": tf.strings.upper(s)}

    model = Model()
    tf.saved_model.save(model, str(_folder(root, "affine") / "model.savedmodel"), signatures=model.serve)


def two_signatures(root: Path) -> None:
    """serving_default: y = 2x; triple: y = 3x (FP32 [N,4])."""

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def double(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": 2.0 * x}

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def triple(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": 3.0 * x}

    model = Model()
    signatures = {"serving_default": model.double, "triple": model.triple}
    tf.saved_model.save(model, str(_folder(root, "signatures") / "model.savedmodel"), signatures=signatures)


def identities(root: Path) -> None:
    """o_<TYPE> = i_<TYPE> [N, 2] for every shared datatype."""
    specs = [tf.TensorSpec([None, 2], dtype, name=f"i_{name}") for name, dtype in IDENTITY_TYPES.items()]

    class Model(tf.Module):
        @tf.function(input_signature=specs)
        def serve(self, *tensors: tf.Tensor) -> dict[str, tf.Tensor]:
            return {f"o_{name}": tf.identity(t) for name, t in zip(IDENTITY_TYPES, tensors, strict=True)}

    model = Model()
    tf.saved_model.save(model, str(_folder(root, "identities") / "model.savedmodel"), signatures=model.serve)


def frozen_graph(root: Path) -> None:
    """A frozen GraphDef: tensor y = x + 10 (FP32 [N,4]), with a variable frozen into it."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    offset = tf.Variable(tf.fill([4], 10.0))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def add(x: tf.Tensor) -> tf.Tensor:
        return tf.identity(x + offset, name="y")

    frozen = convert_variables_to_constants_v2(add.get_concrete_function())
    (_folder(root, "graphdef") / "model.graphdef").write_bytes(
        frozen.graph.as_graph_def().SerializeToString()
    )


if __name__ == "__main__":
    target = Path(sys.argv[1])
    for build in (affine_and_strings, two_signatures, identities, frozen_graph):
        build(target)
