"""The Python backend keeps the backend contract (coreserve.testing's conformance suite), and
the stub's copy of the datatype table stays the core's."""

from __future__ import annotations

import numpy as np

from coreserve import DataType
from coreserve.testing import BackendConformance
from coreserve_python import ipc, pb_utils
from support.paths import TESTS

MODELS = TESTS / "plugins" / "python" / "models"


class TestPythonBackendConformance(BackendConformance):
    # An ordinary batching model on two instances, a decoupled one, one whose model.py completes its config.
    model_folders = [MODELS / "add_one", MODELS / "countdown", MODELS / "autocomplete"]
    unbatched_models = ("countdown",)


def test_the_stub_datatype_table_is_the_core_s() -> None:
    # The stub imports no coreserve (it may run in another environment), so it keeps a copy.
    stub = {name: np.dtype(numpy_type) for name, numpy_type in ipc.DTYPES.items()}
    assert stub == {datatype.value: datatype.numpy_dtype for datatype in DataType}
    # TRITONSERVER_DataType numbers, which Tensor.triton_dtype() answers, are the config enum's.
    numbers = pb_utils._DATATYPE_NUMBERS
    assert numbers == {datatype.value: datatype.config_value for datatype in DataType}
