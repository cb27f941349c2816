"""Every v2 datatype through the HTTP frontend, as JSON and as binary data."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess
from support.datatypes import datatype_sample, identity_config
from support.model_builders import ONNX_TYPES, identity_model, write_model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, echo_backend_site: Path) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("datatypes")
    for datatype in ONNX_TYPES:
        name = f"identity_{datatype.lower()}"
        write_model(
            repository,
            name,
            identity_model(datatype, ["batch", "n"]),
            identity_config(name, datatype, "onnxruntime"),
        )
    for datatype in [*ONNX_TYPES, "BF16"]:
        name = f"echo_{datatype.lower()}"
        write_model(repository, name, b"echo", identity_config(name, datatype, "echo"), filename="model.echo")
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(echo_backend_site), os.environ.get("PYTHONPATH")]))
    }
    process = ServerProcess([repository], env=env).start()
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def _roundtrip(
    client: httpclient.InferenceServerClient,
    model: str,
    datatype: str,
    data: np.ndarray,
    binary_in: bool,
    binary_out: bool,
) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary_in)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)
    return client.infer(model, [tensor], outputs=[output]).as_numpy("OUTPUT0")


@pytest.mark.parametrize("datatype", list(ONNX_TYPES))
@pytest.mark.parametrize(
    ("binary_in", "binary_out"), [(True, True), (False, False), (True, False), (False, True)]
)
def test_onnx_identity(
    client: httpclient.InferenceServerClient, datatype: str, binary_in: bool, binary_out: bool
) -> None:
    data = datatype_sample(datatype)
    result = _roundtrip(client, f"identity_{datatype.lower()}", datatype, data, binary_in, binary_out)
    assert result.shape == data.shape
    if datatype == "BYTES":
        # tritonclient gives JSON string outputs back as str, binary ones as bytes.
        as_bytes = [[x.encode() if isinstance(x, str) else x for x in row] for row in result.tolist()]
        assert as_bytes == data.tolist()
    else:
        assert result.dtype == data.dtype
        np.testing.assert_array_equal(result, data)


@pytest.mark.parametrize("datatype", [*ONNX_TYPES, "BF16"])
def test_third_party_backend_echoes_every_datatype(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    data = datatype_sample(datatype)
    result = _roundtrip(client, f"echo_{datatype.lower()}", datatype, data, True, True)
    assert result.shape == data.shape
    if datatype == "BYTES":
        assert result.tolist() == data.tolist()
    else:
        assert result.dtype == data.dtype
        np.testing.assert_array_equal(result, data)


def test_arbitrary_bytes_survive_binary(client: httpclient.InferenceServerClient) -> None:
    data = np.array([[bytes(range(256)), b"\x00\xff\xfe"]], dtype=np.object_)
    result = _roundtrip(client, "echo_bytes", "BYTES", data, True, True)
    assert result.tolist() == data.tolist()


def test_non_utf8_bytes_for_onnx_strings_are_refused(client: httpclient.InferenceServerClient) -> None:
    data = np.array([[b"ok", b"\xff\xfe bad"]], dtype=np.object_)
    with pytest.raises(InferenceServerException, match="not UTF-8 text") as info:
        _roundtrip(client, "identity_bytes", "BYTES", data, True, True)
    assert info.value.status() == "400"
    ok = np.array([[b"still", b"serving"]], dtype=np.object_)
    assert _roundtrip(client, "identity_bytes", "BYTES", ok, True, True).tolist() == ok.tolist()


def test_non_utf8_output_requested_as_json_is_refused(client: httpclient.InferenceServerClient) -> None:
    data = np.array([[b"\xff"]], dtype=np.object_)
    with pytest.raises(InferenceServerException, match="request it as binary data") as info:
        _roundtrip(client, "echo_bytes", "BYTES", data, True, False)
    assert info.value.status() == "400"


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_non_finite_floats_go_through_json_both_ways_as_on_triton(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    """tritonclient writes NaN and the infinities into JSON data as Python's json does; Triton
    reads them, and writes them back the same way (not as null)."""
    data = np.array([[np.nan, np.inf, -np.inf, 0.1]], dtype=np.dtype(datatype.replace("FP", "float")))
    got = _roundtrip(
        client, f"identity_{datatype.lower()}", datatype, data, binary_in=False, binary_out=False
    )
    np.testing.assert_array_equal(got, data)
