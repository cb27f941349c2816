"""Tensors an ONNX model declares with no dimensions (a scalar, or a rank onnxruntime does not
know), served as Triton's onnxruntime backend serves them (Triton's QA L0_scalar_io): the
configuration gives them dims of 1 only; the model gets them with no dimensions, and its
scalar outputs take the configuration's dims."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from coreserve.testing import ServerFactory
from support.model_builders import write_model

CONFIG = """
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ %s ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ %s ] } ]
"""


def _scalar_model(rank_known: bool) -> onnx.ModelProto:
    """OUTPUT = INPUT * 2, both declared as scalars, or with no shape at all as Triton's QA
    models are (which onnx's checker refuses, so it is not run here, as there)."""
    shape: list[int] | None = [] if rank_known else None
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT", "two"], ["OUTPUT"])],
        "scalar",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, shape)],
        initializer=[two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_scalar_tensors_take_dims_of_one_and_keep_them(
    tmp_path: Path, coreserve_server: ServerFactory
) -> None:
    write_model(tmp_path, "scalar_1dim", _scalar_model(rank_known=False), CONFIG % ("1", "1"))
    write_model(tmp_path, "scalar_2dim", _scalar_model(rank_known=True), CONFIG % ("1, 1", "1, 1"))
    write_model(tmp_path, "scalar_wide", _scalar_model(rank_known=True), CONFIG % ("2", "2"))
    server = coreserve_server(tmp_path, "--exit-on-error=false")
    for client, url in ((grpcclient, server.grpc_url), (httpclient, server.http_url)):
        with client.InferenceServerClient(url) as triton:
            for model, value in (
                ("scalar_1dim", np.array([3], np.float32)),
                ("scalar_2dim", np.array([[4]], np.float32)),
            ):
                tensor = client.InferInput("INPUT", list(value.shape), "FP32")
                tensor.set_data_from_numpy(value)
                result = triton.infer(model, [tensor]).as_numpy("OUTPUT")
                assert result.shape == value.shape and result.tolist() == (value * 2).tolist()
    with httpclient.InferenceServerClient(server.http_url) as triton:
        entry = {e["name"]: e for e in triton.get_model_repository_index()}["scalar_wide"]
    assert entry["state"] == "UNAVAILABLE"
    assert (
        "unable to load model 'scalar_wide', scalar tensor 'INPUT', should only provide 1 in the model "
        "configuration when the model doesn't support batching. Model configuration provided: [2]."
    ) in entry["reason"]


@pytest.mark.parametrize("dims", ["1", "1, 1"])
def test_a_batching_model_keeps_its_dynamic_first_dimension(
    tmp_path: Path, coreserve_server: ServerFactory, dims: str
) -> None:
    write_model(
        tmp_path, "batched", _scalar_model(rank_known=True), "max_batch_size: 4" + CONFIG % (dims, dims)
    )
    server = coreserve_server(tmp_path, "--exit-on-error=false")
    with httpclient.InferenceServerClient(server.http_url) as triton:
        (entry,) = triton.get_model_repository_index()
    assert entry["state"] == "UNAVAILABLE" and "first dimension must be dynamic" in entry["reason"]
