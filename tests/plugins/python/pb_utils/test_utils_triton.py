"""pb_utils against Triton 2.51's own `triton_python_backend_utils`, name by name.

Triton's module is a Python file plus the names its stub adds from its C++ bindings
(`c_python_backend_utils`). The file is pure Python (numpy, json, struct): it is imported here
from the real Triton install (`../shared/tools/real-tritonserver` installs it) and every helper
is run on the same inputs as ours. The bound names are listed from Triton 2.51's stub, as a
model running in it sees them (`dir(pb_utils)` inside a real Triton model).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from coreserve_python import pb_utils

# Where real-tritonserver installs the module; the first that exists is used.
TRITON_MODULE_PATHS = (
    Path.home() / ".cache/real-triton/backends/python/triton_python_backend_utils.py",
    *Path.home().glob(
        ".cache/real-triton/venv/lib/python3*/site-packages/pytriton/tritonserver/backends/python/"
        "triton_python_backend_utils.py"
    ),
)
# dir(pb_utils) inside a model served by Triton 2.51 (its file's names and the stub's), less
# the modules it imports (json, np, struct).
_TRITON_NAMES_TEXT = """
InferenceRequest InferenceResponse Logger MetricFamily ModelConfig PreferredMemory
TRITONSERVER_MEMORY_CPU TRITONSERVER_MEMORY_GPU TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START TRITONSERVER_REQUEST_RELEASE_ALL
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE TRITONSERVER_RESPONSE_COMPLETE_FINAL
TRITON_STRING_TO_NUMPY Tensor TritonError TritonModelException deserialize_bytes_tensor
get_input_config_by_name get_input_tensor_by_name get_model_dir get_output_config_by_name
get_output_tensor_by_name is_model_ready load_model numpy_to_triton_type serialize_byte_tensor
triton_string_to_numpy triton_to_numpy_type unload_model using_decoupled_model_transaction_policy
"""
TRITON_NAMES = tuple(_TRITON_NAMES_TEXT.split())
# Methods of the bound classes, as dir() lists them in Triton 2.51.
TRITON_METHODS = {
    "InferenceRequest": "async_exec correlation_id exec flags get_response_sender inputs is_cancelled "
    "parameters request_id requested_output_names set_flags set_release_flags timeout trace",
    "InferenceResponse": "error has_error output_tensors",
    "Tensor": "as_numpy from_dlpack is_cpu name shape to_dlpack triton_dtype __dlpack__ __dlpack_device__",
    "Logger": "log log_info log_warn log_error log_verbose LogLevel INFO WARNING ERROR VERBOSE",
    "TritonError": "code message UNKNOWN INTERNAL NOT_FOUND INVALID_ARG UNAVAILABLE UNSUPPORTED "
    "ALREADY_EXISTS CANCELLED",
    "MetricFamily": "Metric COUNTER GAUGE HISTOGRAM",
    "ModelConfig": "add_input add_output as_dict set_dynamic_batching set_max_batch_size "
    "set_model_transaction_policy",
}


@pytest.fixture(scope="module")
def triton() -> ModuleType:
    path = next((p for p in TRITON_MODULE_PATHS if p.is_file()), None)
    if path is None:
        pytest.skip("Triton's triton_python_backend_utils.py is not installed (run real-tritonserver once)")
    spec = importlib.util.spec_from_file_location("triton_pb_utils_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_name_of_tritons_module_exists_here(triton: ModuleType) -> None:
    file_names = {name for name in vars(triton) if not name.startswith("_")} - {"json", "np", "struct"}
    assert file_names <= set(TRITON_NAMES), "the list of Triton's names is out of date"
    missing = [name for name in TRITON_NAMES if not hasattr(pb_utils, name)]
    assert not missing, f"pb_utils lacks Triton's {missing}"
    for name in TRITON_NAMES:
        assert name in pb_utils.__all__, name
    for cls, methods in TRITON_METHODS.items():
        absent = [m for m in methods.split() if not hasattr(getattr(pb_utils, cls), m)]
        assert not absent, f"pb_utils.{cls} lacks {absent}"


def test_constants_are_tritons(triton: ModuleType) -> None:
    for name in TRITON_NAMES:
        if name.startswith("TRITONSERVER_REQUEST") or name == "TRITONSERVER_RESPONSE_COMPLETE_FINAL":
            assert getattr(pb_utils, name) == getattr(triton, name), name
    assert pb_utils.TRITON_STRING_TO_NUMPY == triton.TRITON_STRING_TO_NUMPY
    # From Triton's stub (a model's view of its bindings): memory types, log levels, kinds, codes.
    assert (int(pb_utils.TRITONSERVER_MEMORY_GPU), int(pb_utils.TRITONSERVER_MEMORY_CPU)) == (0, 1)
    assert [int(pb_utils.Logger.INFO), int(pb_utils.Logger.WARNING), int(pb_utils.Logger.ERROR),
            int(pb_utils.Logger.VERBOSE)] == [0, 1, 2, 3]  # fmt: skip
    kinds = pb_utils.MetricFamily
    assert (int(kinds.COUNTER), int(kinds.GAUGE), int(kinds.HISTOGRAM)) == (0, 1, 2)
    codes = [pb_utils.TritonError.UNKNOWN, pb_utils.TritonError.INTERNAL, pb_utils.TritonError.NOT_FOUND,
             pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.UNAVAILABLE,
             pb_utils.TritonError.UNSUPPORTED, pb_utils.TritonError.ALREADY_EXISTS,
             pb_utils.TritonError.CANCELLED]  # fmt: skip
    assert codes == list(range(8))
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL


TYPE_SAMPLES: list[Any] = [
    np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
    np.float16, np.float32, np.float64, np.object_, np.bytes_, np.str_, bool, int, float,
    np.dtype(np.float32), np.dtype(np.object_), np.dtype(np.int64), np.complex64, "float32",
]  # fmt: skip


def _same(ours: Any, theirs: Any) -> None:
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray) and ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert ours.tolist() == theirs.tolist()
    else:
        assert type(ours) is type(theirs) and ours == theirs, (ours, theirs)


def test_type_helpers_answer_as_tritons(triton: ModuleType) -> None:
    for sample in TYPE_SAMPLES:
        _same(pb_utils.numpy_to_triton_type(sample), triton.numpy_to_triton_type(sample))
    for number in [*range(-1, 16), 1.0]:
        assert pb_utils.triton_to_numpy_type(number) is triton.triton_to_numpy_type(number)
    for name in [*triton.TRITON_STRING_TO_NUMPY, "TYPE_BF16", "TYPE_NOPE", "FP32"]:
        try:
            expected = triton.triton_string_to_numpy(name)
        except KeyError:
            with pytest.raises(KeyError):
                pb_utils.triton_string_to_numpy(name)
        else:
            assert pb_utils.triton_string_to_numpy(name) is expected


BYTES_SAMPLES = [
    np.array([b"ab", b"", b"\x00z"], dtype=np.object_),
    np.array([["x", 1], [2.5, b"y"]], dtype=np.object_),  # str() of non-bytes, C order
    np.array([b"ab\x00", b"c"], dtype=np.bytes_),  # numpy strips trailing NULs, as Triton warns
    np.array([], dtype=np.object_),
    np.array([1, 2], dtype=np.int32),  # not BYTES: None
    np.array(["é"], dtype=np.object_),
]


def test_bytes_helpers_answer_as_tritons(triton: ModuleType) -> None:
    for sample in BYTES_SAMPLES:
        ours, theirs = pb_utils.serialize_byte_tensor(sample), triton.serialize_byte_tensor(sample)
        _same(ours, theirs)
        if isinstance(theirs, bytes):
            _same(pb_utils.deserialize_bytes_tensor(ours), triton.deserialize_bytes_tensor(theirs))
            as_array = np.frombuffer(theirs, dtype=np.uint8)
            _same(pb_utils.deserialize_bytes_tensor(as_array), triton.deserialize_bytes_tensor(as_array))
    _same(pb_utils.deserialize_bytes_tensor(b""), triton.deserialize_bytes_tensor(b""))
    truncated = b"\x05\x00\x00\x00ab"
    with pytest.raises(Exception) as theirs_error:
        triton.deserialize_bytes_tensor(truncated)
    with pytest.raises(type(theirs_error.value)):
        pb_utils.deserialize_bytes_tensor(truncated)


CONFIGS: list[dict[str, Any]] = [
    {"name": "m", "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}], "output": []},
    {"name": "m", "input": [], "output": [{"name": "B", "data_type": "TYPE_INT32", "dims": [-1]}],
     "model_transaction_policy": {"decoupled": True}},
    {"name": "m", "model_transaction_policy": {"decoupled": False}},
    {},
]  # fmt: skip


def test_config_lookups_answer_as_tritons(triton: ModuleType) -> None:
    for config in CONFIGS:
        for name in ("A", "B", "Z"):
            assert pb_utils.get_input_config_by_name(config, name) == triton.get_input_config_by_name(
                config, name
            )
            assert pb_utils.get_output_config_by_name(config, name) == triton.get_output_config_by_name(
                config, name
            )
        _same(
            pb_utils.using_decoupled_model_transaction_policy(config),
            triton.using_decoupled_model_transaction_policy(config),
        )


class _Request:
    def __init__(self, tensors: list[Any]) -> None:
        self._tensors = tensors

    def inputs(self) -> list[Any]:
        return self._tensors

    def output_tensors(self) -> list[Any]:
        return self._tensors


def test_tensor_lookups_answer_as_tritons(triton: ModuleType) -> None:
    tensors = [pb_utils.Tensor("A", np.zeros(1)), pb_utils.Tensor("B", np.ones(2))]
    holder: Any = _Request(tensors)  # a request and a response, as both helpers read them
    for name in ("A", "B", "C"):
        assert pb_utils.get_input_tensor_by_name(holder, name) is triton.get_input_tensor_by_name(
            holder, name
        )
        assert pb_utils.get_output_tensor_by_name(holder, name) is triton.get_output_tensor_by_name(
            holder, name
        )


# (method, argument) steps of auto_complete_config, run on both ModelConfigs from the same start.
CONFIG_STEPS: list[list[tuple[str, Any]]] = [
    [("set_max_batch_size", 8), ("set_max_batch_size", 4)],
    [("set_max_batch_size", 2), ("set_max_batch_size", 16)],
    [("set_dynamic_batching", None), ("set_dynamic_batching", None)],
    [("add_input", {"name": "A", "data_type": "TYPE_FP32", "dims": [4]})],
    [("add_input", {"name": "A", "data_type": "TYPE_INT8", "dims": [4]})],
    [("add_input", {"name": "A", "data_type": "TYPE_FP32", "dims": [5]})],
    [("add_input", {"name": "A", "data_type": "TYPE_FP32", "dims": [4], "optional": True})],
    [("add_input", {"name": "N", "data_type": "TYPE_FP32", "dims": [1], "format": "x"})],
    [("add_input", {"name": "N", "dims": [1]})],
    [("add_input", {"name": "N", "data_type": "TYPE_FP32"})],
    [("add_output", {"name": "O", "data_type": "TYPE_FP32", "dims": [2]}),
     ("add_output", {"name": "O", "data_type": "TYPE_FP16", "dims": [2]})],
    [("add_output", {"name": "O", "data_type": "TYPE_FP32", "dims": [2], "optional": True})],
    [("set_model_transaction_policy", {"decoupled": True}),
     ("set_model_transaction_policy", {"decoupled": False})],
    [("set_model_transaction_policy", {"decoupled": True, "x": 1})],
]  # fmt: skip
START_CONFIGS: list[dict[str, Any]] = [
    {"name": "m", "max_batch_size": 0, "input": [], "output": []},
    {"name": "m", "max_batch_size": 4, "sequence_batching": {}, "output": [],
     "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4], "optional": False}]},
    {"name": "m", "max_batch_size": 0, "output": [],
     "input": [{"name": "A", "data_type": "TYPE_INVALID", "dims": []}]},
]  # fmt: skip


def _run_steps(config: Any, steps: list[tuple[str, Any]]) -> tuple[Any, str | None]:
    for method, argument in steps:
        try:
            getattr(config, method)(*(() if argument is None else (argument,)))
        except (ValueError, KeyError) as exc:
            return config.as_dict(), f"{type(exc).__name__}: {exc}"
    return config.as_dict(), None


def test_model_config_completes_as_tritons(triton: ModuleType) -> None:
    for start in START_CONFIGS:
        for steps in CONFIG_STEPS:
            ours = _run_steps(pb_utils.ModelConfig(json.loads(json.dumps(start))), steps)
            theirs = _run_steps(triton.ModelConfig(json.dumps(start)), steps)
            assert ours == theirs, (start, steps)
    # Triton's stub hands the configuration over as JSON text; ours takes that too.
    assert pb_utils.ModelConfig(json.dumps(START_CONFIGS[0])).as_dict() == START_CONFIGS[0]


def test_requests_take_every_argument_form_tritons_bindings_take() -> None:
    request = pb_utils.InferenceRequest(
        model_name=b"side",
        inputs=[pb_utils.Tensor(b"IN", np.ones(1, np.float32))],
        requested_output_names=[b"OUT", "OTHER"],
        request_id=b"r-1",
        correlation_id="session-7",
        timeout=1000,
        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
        parameters={"a": 1, "b": True, "c": "s"},
    )
    assert request.model_name() == "side" and request.request_id() == "r-1"
    assert request.requested_output_names() == {"OUT", "OTHER"} and request.inputs()[0].name() == "IN"
    assert request.correlation_id() == "session-7" and request.timeout() == 1000
    assert json.loads(request.parameters()) == {"a": 1, "b": True, "c": "s"}
    assert request.trace().get_context() is None
    request.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
    assert request.flags() == 1
    # Refused in Triton's words.
    with pytest.raises(pb_utils.TritonModelException, match=r"^Correlation ID must be integer or string$"):
        pb_utils.InferenceRequest(model_name="x", inputs=[], requested_output_names=[], correlation_id=1.5)  # type: ignore[arg-type]
    with pytest.raises(
        pb_utils.TritonModelException,
        match=r"^Expect parameters values to have type bool/int/str, found type <class 'float'>$",
    ):
        pb_utils.InferenceRequest(model_name="x", inputs=[], requested_output_names=[], parameters={"a": 1.5})
    # Triton's bindings have no default for these three (its QA bls test_bls_incorrect_args).
    for missing in ("model_name", "inputs", "requested_output_names"):
        given = {"model_name": "x", "inputs": [], "requested_output_names": []}
        del given[missing]
        with pytest.raises(TypeError, match="incompatible constructor arguments"):
            pb_utils.InferenceRequest(**given)  # type: ignore[arg-type]
    assert pb_utils.Tensor("T", np.zeros(2, np.float32)).triton_dtype() == 11
    assert pb_utils.Tensor("T", np.array([b"a"], dtype=np.object_)).triton_dtype() == 13


def test_arguments_triton_refuses_are_refused_with_its_exception() -> None:
    """Triton's QA L0_backend_python argument_validation: a None where Triton's bindings want a
    value is a TypeError; a None in a list of tensors, or an empty name, Triton's own exception
    in its words. They were taken, and failed later (or never)."""
    tensor = pb_utils.Tensor("IN", np.asarray([1, 2], np.int32))
    given: dict[str, Any] = {"model_name": "my_model", "inputs": [tensor], "requested_output_names": ["OUT"]}
    for argument in ("request_id", "correlation_id", "inputs", "requested_output_names", "model_name",
                     "model_version", "flags", "timeout"):  # fmt: skip
        with pytest.raises(TypeError, match=f"{argument} is required, not None"):
            pb_utils.InferenceRequest(**{**given, argument: None})
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(**{**given, "requested_output_names": [None]})
    with pytest.raises(TypeError, match="inputs must be a list of Tensor, holding ndarray"):
        pb_utils.InferenceRequest(**{**given, "inputs": [tensor.as_numpy()]})
    with pytest.raises(pb_utils.TritonModelException) as empty:
        pb_utils.InferenceRequest(**{**given, "inputs": [None], "request_id": "r"})
    assert (
        empty.value.message()
        == "Input tensor for request with id 'r' and model name 'my_model' should not be empty."
    )
    with pytest.raises(pb_utils.TritonModelException) as unnamed:
        pb_utils.InferenceRequest(**{**given, "requested_output_names": [""]})
    assert unnamed.value.message() == (
        "Requested output name for request with id '' and model name 'my_model' should not be empty."
    )
    assert (
        pb_utils.InferenceRequest(model_name="my_model", inputs=[], requested_output_names=[]).inputs() == []
    )
    assert (
        pb_utils.InferenceRequest(**given, correlation_id="test_str_id-5").correlation_id() == "test_str_id-5"
    )

    with pytest.raises(pb_utils.TritonModelException) as none_out:
        pb_utils.InferenceResponse(output_tensors=[None])  # type: ignore[list-item]
    assert none_out.value.message() == "Output tensor for inference response should not be empty."
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)  # type: ignore[arg-type]
    assert pb_utils.InferenceResponse(output_tensors=[]).output_tensors() == []
    assert pb_utils.InferenceResponse([tensor]).output_tensors() == [tensor]

    for name, data in ((None, tensor.as_numpy()), ("OUTPUT0", None), ("", None)):
        with pytest.raises(TypeError):
            pb_utils.Tensor(name, data)  # type: ignore[arg-type]
    for name in ("OUTPUT0", ""):
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.Tensor.from_dlpack(name, None)

    for call in (
        lambda: pb_utils.Logger.log("Invalid Level", None),  # type: ignore[arg-type]
        lambda: pb_utils.Logger.log("Invalid Level", 1),  # type: ignore[arg-type]
        lambda: pb_utils.Logger.log_info(None),  # type: ignore[arg-type]
        lambda: pb_utils.Logger.log_warn(None),  # type: ignore[arg-type]
        lambda: pb_utils.Logger.log_error(None),  # type: ignore[arg-type]
        lambda: pb_utils.Logger.log_verbose(None),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError):
            call()
    pb_utils.Logger.log("Level unspecified")
