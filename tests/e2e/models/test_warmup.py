"""model_warmup: samples run before a version reports READY; a failing sample keeps it unavailable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerFactory
from support.model_builders import add_sub_model, write_model

ADD_SUB = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
WARMUPS = {
    "zero": 'model_warmup [ { name: "zeros" batch_size: 2 count: 3 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } inputs { key: "INPUT1" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]',
    "random": 'model_warmup [ { name: "noise" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } inputs { key: "INPUT1" value { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ]',
    "from_file": 'model_warmup [ { name: "file" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "raw.bin" } } inputs { key: "INPUT1" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]',
}
FAILING = {
    "wrong_name": (
        'model_warmup [ { name: "typo" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } inputs { key: "INPUT9" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]',
        # (INPUT9 would reach the model unchecked, as in Triton: INPUT1 is what it lacks.)
        "warmup 'typo' failed: expected 2 inputs but got 1 inputs for model 'wrong_name'. Got input(s) "
        "['INPUT0'], but missing required input(s) ['INPUT1']",
    ),
    "wrong_shape": (
        'model_warmup [ { name: "shape" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } } inputs { key: "INPUT1" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]',
        "warmup 'shape' failed: unexpected shape for input 'INPUT0'",
    ),
    "variable_dims": (
        'model_warmup [ { name: "open" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ -1 ] zero_data: true } } inputs { key: "INPUT1" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]',
        "warmup setting expects all variable-size dimensions are specified for input 'INPUT0'",
    ),
    "missing_file": (
        'model_warmup [ { name: "nofile" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "absent.bin" } } inputs { key: "INPUT1" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]',
        "warmup input 'INPUT0' cannot read",
    ),
}


def test_warmup_runs_before_ready_and_failures_make_the_model_unavailable(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    for name, warmup in {**WARMUPS, **{k: v[0] for k, v in FAILING.items()}}.items():
        folder = write_model(tmp_path, name, add_sub_model("FP32", ["batch", 4]), ADD_SUB + warmup)
        (folder / "warmup").mkdir()
        (folder / "warmup" / "raw.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    server = coreserve_server(tmp_path, "--exit-on-error=false")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for name in WARMUPS:
            assert client.is_model_ready(name), name
            stats = client.get_inference_statistics(name)["model_stats"][0]
            assert stats["inference_count"] == 0  # warmup samples are not counted
        for name, (_, reason) in FAILING.items():
            with pytest.raises(InferenceServerException) as info:
                client.get_model_metadata(name)
            assert info.value.status() == "404" and reason in info.value.message(), name
    finally:
        client.close()


# Declares no input; says which inputs each request brought.
TELLING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            pb_utils.Logger.log_info(f"inputs: {sorted(t.name() for t in request.inputs())}")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([True]))]) for _ in requests]
"""
TELLING_CONFIG = """
backend: "python"
max_batch_size: 0
output [ { name: "OUTPUT0" data_type: TYPE_BOOL dims: [ 1 ] } ]
model_warmup [ { name: "regular sample" batch_size: 1
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: 4 zero_data: false } } } ]
"""


def test_a_sample_of_an_input_the_configuration_does_not_declare_reaches_the_model(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    """Triton's "input override" (its QA bls_model_loading): the model loads, and its warmup
    request brings the sample. The load used to fail: `unexpected inference input`."""
    folder = write_model(tmp_path, "telling", None, TELLING_CONFIG)
    (folder / "1" / "model.py").write_text(TELLING)
    server = coreserve_server(tmp_path)
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert client.is_model_ready("telling")
    assert "inputs: ['INPUT0']" in server.log


# Counts what each instance's warmup brought; fails when told to, as Triton's QA failing_infer.
COUNTING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        pb_utils.Logger.log_info(f"{self.instance} got {len(requests)} request(s)")
        if pb_utils.get_input_tensor_by_name(requests[0], "FAIL") is not None:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred")) for _ in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""
# As Triton's QA warmup `decoupled` model: ends each request with the final flag alone.
SILENT = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
# Hands each request back to be run again (Triton's request rescheduling).
RESCHEDULING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
"""
IO = """
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
SAMPLE = 'model_warmup [ { name: "%s" batch_size: %d count: %d inputs { key: "IN" value { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } %s } ]'
PYTHON_WARMUPS = {
    # name: (model.py, configuration)
    "batched": (
        COUNTING,
        "max_batch_size: 4"
        + IO
        + "instance_group [ { count: 2 kind: KIND_CPU } ]"
        + SAMPLE % ("three", 3, 2, ""),
    ),
    "sequence": (
        COUNTING,
        "max_batch_size: 2" + IO + 'sequence_batching { control_input [ { name: "START" control '
        "[ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }" + SAMPLE % ("seq", 1, 1, ""),
    ),
    "silent": (SILENT, IO + "model_transaction_policy { decoupled: true }" + SAMPLE % ("quiet", 1, 1, "")),
    # No queue takes back what the warmup's instance hands back: the run ends (it hung).
    "rescheduling": (
        RESCHEDULING,
        IO + "model_transaction_policy { decoupled: true }" + SAMPLE % ("again", 1, 1, ""),
    ),
    "failing": (
        COUNTING,
        IO
        + SAMPLE
        % (
            "zero sample",
            1,
            1,
            'inputs { key: "FAIL" value { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }',
        ),
    ),
}


def test_each_instance_runs_each_sample_as_tritons_warmup_does(
    coreserve_server: ServerFactory, tmp_path: Path
) -> None:
    """Triton's QA L0_warmup: straight on each instance, `batch_size` requests at once, `count`
    times, logged at verbose level 1; a sequence model needs no sequence, a decoupled model may
    send no response, and a failed sample is refused in Triton's words."""
    for name, (code, config) in PYTHON_WARMUPS.items():
        folder = write_model(tmp_path, name, None, config)
        (folder / "1" / "model.py").write_text(code)
    server = coreserve_server(tmp_path, "--exit-on-error=false", "--log-verbose=1")
    with httpclient.InferenceServerClient(server.http_url) as client:
        for name in ("batched", "sequence", "silent", "rescheduling"):
            assert client.is_model_ready(name), name
        assert not client.is_model_ready("failing")
        (failing,) = [e for e in client.get_model_repository_index() if e["name"] == "failing"]
    assert "failed to run warmup sample 'zero sample': An Error Occurred; " in failing["reason"]
    for instance in ("batched_0_0", "batched_0_1"):
        assert server.log.count(f"{instance} got 3 request(s)") == 2
        for iteration in (1, 2):
            assert (
                f"model 'batched' instance {instance} is running warmup sample 'three' for iteration {iteration}"
                in server.log
            )
    assert "sequence_0 got 1 request(s)" in server.log
