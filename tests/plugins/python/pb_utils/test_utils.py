"""The triton_python_backend_utils API, in process (no server needed for these parts)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coreserve_python import pb_utils


def test_tensor_basics_and_dlpack() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("T", data)
    assert tensor.name() == "T" and tensor.is_cpu() and tensor.shape() == [2, 3]
    assert tensor.as_numpy() is data
    round_trip = pb_utils.Tensor.from_dlpack("U", tensor.to_dlpack())
    np.testing.assert_array_equal(round_trip.as_numpy(), data)
    from_object = pb_utils.Tensor.from_dlpack("V", data)  # anything with __dlpack__
    np.testing.assert_array_equal(from_object.as_numpy(), data)
    strings = pb_utils.Tensor("S", np.array(["a", "b"]))
    assert strings.as_numpy().dtype == np.object_
    with pytest.raises(
        pb_utils.TritonModelException, match="DLPack does not have support for string tensors"
    ):
        strings.to_dlpack()
    with pytest.raises(TypeError, match="needs a numpy array"):  # (Triton's bindings: a TypeError)
        pb_utils.Tensor("X", [1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "array",
    [
        np.array([1 + 2j], np.complex64),
        np.array(["2020-01-01"], "datetime64[D]"),
        np.array([1.5], np.longdouble),
        np.zeros(2, "V4"),
    ],
    ids=["complex", "date", "long-double", "record"],
)
def test_a_tensor_of_a_dtype_triton_has_no_datatype_for_is_refused_in_its_words(array: np.ndarray) -> None:
    with pytest.raises(pb_utils.TritonModelException, match=r"^NumPy dtype is not supported\.$"):
        pb_utils.Tensor("OUT", array)


def test_requests_responses_and_errors() -> None:
    request = pb_utils.InferenceRequest(
        model_name="m",
        inputs=[pb_utils.Tensor("A", np.ones(2))],
        requested_output_names=["B"],
        parameters={"x": 1},
        request_id="r",
    )
    assert pb_utils.get_input_tensor_by_name(request, "A").name() == "A"
    assert pb_utils.get_input_tensor_by_name(request, "Z") is None
    assert json.loads(request.parameters()) == {"x": 1} and request.request_id() == "r"
    error = pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG)
    response = pb_utils.InferenceResponse(error=error)
    assert response.has_error() and response.error().message() == "bad" and response.error().code() == 3
    ok = pb_utils.InferenceResponse([pb_utils.Tensor("B", np.zeros(1))])
    assert not ok.has_error() and pb_utils.get_output_tensor_by_name(ok, "B") is not None
    with pytest.raises(pb_utils.TritonModelException, match="only requests given to execute"):
        request.get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="only inside a model served by coreserve"):
        request.exec()


def test_type_helpers() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_string(np.int64) == "TYPE_INT64"
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    encoded = pb_utils.serialize_byte_tensor(np.array([b"ab", b""], dtype=np.object_))
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == [b"ab", b""]
    with pytest.raises(KeyError):  # as Triton's module
        pb_utils.triton_string_to_numpy("TYPE_NOPE")
    assert pb_utils.triton_to_numpy_type(99) is None and pb_utils.numpy_to_triton_type(np.str_) is None


def test_config_helpers() -> None:
    config = {"name": "m", "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}]}
    assert pb_utils.get_input_config_by_name(config, "A")["dims"] == [4]
    assert pb_utils.get_output_config_by_name(config, "A") is None
    completed = pb_utils.ModelConfig(config)
    completed.set_max_batch_size(8)
    completed.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})  # agrees with the file
    completed.add_output({"name": "B", "data_type": "TYPE_INT32", "dims": [-1]})
    completed.set_dynamic_batching()
    completed.set_model_transaction_policy({"decoupled": True})
    result = completed.as_dict()
    assert result["max_batch_size"] == 8 and result["dynamic_batching"] == {}
    assert result["output"] == [{"name": "B", "data_type": "TYPE_INT32", "dims": [-1]}]
    assert result["model_transaction_policy"] == {"decoupled": True}
    with pytest.raises(ValueError, match="configuration specifies dims \\[4\\]"):
        completed.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8"):
        completed.set_max_batch_size(2)
    with pytest.raises(ValueError, match="is missing 'dims' property"):
        completed.add_input({"name": "C", "data_type": "TYPE_FP32"})


def test_shim_module_has_the_same_api() -> None:
    import importlib
    import sys
    from pathlib import Path

    import coreserve_python

    sys.path.insert(0, str(Path(coreserve_python.__file__).parent / "shim"))
    try:
        shim = importlib.import_module("triton_python_backend_utils")
    finally:
        sys.path.pop(0)
    for name in pb_utils.__all__:
        assert getattr(shim, name) is getattr(pb_utils, name)
    # The modules Triton's pb_utils imports at its top, which models reach through it.
    import json
    import struct

    assert (shim.np, shim.json, shim.struct) == (np, json, struct)


def test_stub_copies_for_other_pythons_carry_every_module_the_stub_imports() -> None:
    """A custom EXECUTION_ENV_PATH runs a copy of the stub's modules: none may be left out."""
    import ast
    from pathlib import Path

    import coreserve_python
    from coreserve_python.server.env._environment import STUB_MODULES

    package = Path(coreserve_python.__file__).parent

    def copied(parts: list[str]) -> bool:
        path = "/".join(parts)
        return f"{path}.py" in STUB_MODULES or f"{path}/__init__.py" in STUB_MODULES

    for name in STUB_MODULES:
        for node in ast.walk(ast.parse((package / name).read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coreserve_python"):
                parents = (node.module or "").split(".")[1:]
                imported = [parents] if parents else []
                # `from coreserve_python.a import b` imports module a/b.py where there is one
                imported += [
                    [*parents, alias.name]
                    for alias in node.names
                    if package.joinpath(*parents, f"{alias.name}.py").exists() or not parents
                ]
                for target in imported:
                    assert copied(target), f"{name} imports coreserve_python.{'.'.join(target)}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("coreserve_python."):
                        assert copied(alias.name.split(".")[1:]), f"{name} imports {alias.name}"
