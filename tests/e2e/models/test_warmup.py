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
        "warmup 'typo' failed: unexpected inference input 'INPUT9'",
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
