"""Real models for tests, built with the `onnx` helper API, and repository folders around them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def onnx_model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def identity_model(datatype: str, shape: list) -> onnx.ModelProto:
    """INPUT0 -> OUTPUT0 unchanged."""
    kind = ONNX_TYPES[datatype]
    return onnx_model(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        [helper.make_tensor_value_info("INPUT0", kind, shape)],
        [helper.make_tensor_value_info("OUTPUT0", kind, shape)],
    )


def add_sub_model(datatype: str = "FP32", shape: list | None = None) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    kind = ONNX_TYPES[datatype]
    shape = shape or ["batch", 4]
    info = lambda name: helper.make_tensor_value_info(name, kind, shape)  # noqa: E731
    return onnx_model(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [info("INPUT0"), info("INPUT1")],
        [info("OUTPUT0"), info("OUTPUT1")],
    )


# add_sub_model() with the default FP32 [4] shape, batched: the config that serves it.
ADD_SUB_CONFIG = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def pipeline_config(max_batch_size: int) -> str:
    """An ensemble of one add_sub step (add_sub_model's config at the same max batch size): A + B -> SUM."""
    return f"""
platform: "ensemble"
max_batch_size: {max_batch_size}
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "add_sub" model_version: -1
  input_map {{ key: "INPUT0" value: "A" }} input_map {{ key: "INPUT1" value: "B" }}
  output_map {{ key: "OUTPUT0" value: "SUM" }} }} ] }}
"""


def scale_model(factor: float, shape: list | None = None) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 * factor (FP32): tells versions apart by their output."""
    shape = shape or ["batch", 4]
    constant = numpy_helper.from_array(np.array(factor, dtype=np.float32), "factor")
    return onnx_model(
        [helper.make_node("Mul", ["INPUT0", "factor"], ["OUTPUT0"])],
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
        [constant],
    )


# An ensemble of one scale_model step (batched, 4 FP32 in and out, the same tensor names).
ENSEMBLE_OF_SCALE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "scale" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" }
} ] }
"""


def write_model(
    repository: Path,
    name: str,
    model: onnx.ModelProto | bytes | None,
    config: str | None = None,
    versions: tuple[int, ...] = (1,),
    filename: str = "model.onnx",
) -> Path:
    """Writes <repository>/<name>/config.pbtxt and one model file per version folder."""
    folder = repository / name
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    for version in versions:
        version_folder = folder / str(version)
        version_folder.mkdir(exist_ok=True)
        if model is not None:
            data = model if isinstance(model, bytes) else model.SerializeToString()
            (version_folder / filename).write_bytes(data)
    return folder


# The accumulator model's configuration: a sequence batcher over two instances.
ACCUMULATOR_SEQUENCE_CONFIG = """
backend: "onnxruntime"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "CORR_OUT" data_type: TYPE_UINT64 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "acc_in" output_name: "acc_out" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"""


def accumulator_model(corrid: str = "UINT64") -> onnx.ModelProto:
    """A stateful running sum: OUTPUT = INPUT + (START ? 0 : acc_in); acc_out = OUTPUT.

    START and CORRID are sequence-batcher control inputs; acc_in/acc_out the implicit state.
    CORR_OUT echoes CORRID so tests can see it.
    """
    batch = ["batch", 1]
    one = numpy_helper.from_array(np.array(1, dtype=np.int32), "one")
    return onnx_model(
        [
            helper.make_node("Sub", ["one", "START"], ["keep"]),
            helper.make_node("Mul", ["acc_in", "keep"], ["carried"]),
            helper.make_node("Add", ["carried", "INPUT"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["acc_out"]),
            helper.make_node("Identity", ["CORRID"], ["CORR_OUT"]),
        ],
        [
            helper.make_tensor_value_info("INPUT", TensorProto.INT32, batch),
            helper.make_tensor_value_info("START", TensorProto.INT32, batch),
            helper.make_tensor_value_info("CORRID", ONNX_TYPES[corrid], batch),
            helper.make_tensor_value_info("acc_in", TensorProto.INT32, batch),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, batch),
            helper.make_tensor_value_info("acc_out", TensorProto.INT32, batch),
            helper.make_tensor_value_info("CORR_OUT", ONNX_TYPES[corrid], batch),
        ],
        [one],
    )


def ragged_sum_model() -> onnx.ModelProto:
    """A BERT-style model without padding: INPUT is every request's elements concatenated (FP32,
    1-D) and INDEX the accumulated element count after each request (INT32, one per request).

    SUM[i] = the sum of request i's elements ([requests, 1]); DOUBLED = 2 * INPUT, flat (for a
    batch_output that scatters it back in the shape of each request's INPUT).
    """
    nodes = [
        helper.make_node("CumSum", ["INPUT", "axis"], ["running"]),
        helper.make_node("Concat", ["zero", "running"], ["running0"], axis=0),
        helper.make_node("Cast", ["INDEX"], ["index"], to=TensorProto.INT64),
        helper.make_node("Gather", ["running0", "index"], ["upto"], axis=0),
        helper.make_node("Slice", ["upto", "first", "last"], ["upto_before"]),
        helper.make_node("Concat", ["zero", "upto_before"], ["before"], axis=0),
        helper.make_node("Sub", ["upto", "before"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "column"], ["SUM"]),
        helper.make_node("Mul", ["INPUT", "two"], ["DOUBLED"]),
    ]
    constants = [
        numpy_helper.from_array(np.array(0, np.int64), "axis"),
        numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "first"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array([1], np.int64), "column"),
        numpy_helper.from_array(np.array(2, np.float32), "two"),
    ]
    return onnx_model(
        nodes,
        [
            helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["elements"]),
            helper.make_tensor_value_info("INDEX", TensorProto.INT32, ["requests"]),
        ],
        [
            helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["requests", 1]),
            helper.make_tensor_value_info("DOUBLED", TensorProto.FLOAT, ["elements"]),
        ],
        constants,
    )


BLS_CALLS_SCALE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT = scale(scale(INPUT0)) through two BLS calls: the first given the request's trace."""

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            for trace in (request.trace(), None):
                call = pb_utils.InferenceRequest(
                    model_name="scale",
                    requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", values)],
                    trace=trace,
                )
                answer = call.exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                values = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values)]))
        return responses
'''
BLS_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def write_bls_model(repository: Path, name: str = "bls") -> Path:
    """A Python model that calls the repository's `scale` model twice by BLS, the first call with
    `trace=request.trace()` (a child of the request in its trace), the second without (untraced)."""
    folder = write_model(repository, name, None, BLS_CONFIG)
    (folder / "1" / "model.py").write_text(BLS_CALLS_SCALE)
    return folder


# A Python model that echoes input A as output B. Its initialize() loads model TO_LOAD unless
# it is ready (Triton's README pattern), its execute() unloads model TO_UNLOAD ("": neither).
ECHO_THAT_LOADS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if TO_LOAD and not pb_utils.is_model_ready(TO_LOAD):
            pb_utils.load_model(TO_LOAD)

    def execute(self, requests):
        if TO_UNLOAD:
            pb_utils.unload_model(TO_UNLOAD)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("B", pb_utils.get_input_tensor_by_name(r, "A").as_numpy())])
            for r in requests
        ]
"""
ECHO_AB_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def write_echo_that_loads(repository: Path, name: str, loads: str = "", unloads: str = "") -> Path:
    """<repository>/<name>: ECHO_THAT_LOADS, loading model `loads` as it starts and unloading
    model `unloads` at each execute() (each where named)."""
    folder = write_model(repository, name, None, ECHO_AB_CONFIG)
    source = ECHO_THAT_LOADS.replace("TO_LOAD", repr(loads)).replace("TO_UNLOAD", repr(unloads))
    (folder / "1" / "model.py").write_text(source)
    return folder
