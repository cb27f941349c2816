"""pb_utils.Tensor and DLPack, in process: zero-copy exchange with torch and numpy, where the
memory lies, and Triton 2.51's error texts (python_backend/src/pb_tensor.cc, quoted literally
below as its server answers them to the same calls in a model.py, spaces included). The CUDA
tests run where torch sees a CUDA device and skip elsewhere."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from coreserve_python import pb_utils

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA: torch sees no CUDA device")


class _ProducerOn:
    """A DLPack producer that reports `device` for `data`'s memory: stands for the producers of
    devices this machine lacks (their capsules still describe host memory)."""

    def __init__(self, data: np.ndarray, device: tuple[int, int]) -> None:
        self.data = data
        self.device = device
        self.streams: list[Any] = []

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        self.streams.append(stream)
        return self.data.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def test_from_dlpack_shares_the_memory_of_torch_tensors_and_capsules() -> None:
    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    by_object = pb_utils.Tensor.from_dlpack("A", source)
    by_capsule = pb_utils.Tensor.from_dlpack("B", torch.utils.dlpack.to_dlpack(source))
    source[0, 0] = 42.0  # written after the tensors were made: both see it (no copy)
    for tensor in (by_object, by_capsule):
        assert tensor.is_cpu() and tensor.shape() == [2, 3] and tensor.triton_dtype() == 11
        assert tensor.__dlpack_device__() == (1, 0)
        assert tensor.as_numpy()[0, 0] == 42.0
    numpy_source = np.ones(4, dtype=np.int64)
    assert pb_utils.Tensor.from_dlpack("C", numpy_source).as_numpy().ctypes.data == numpy_source.ctypes.data


def test_to_dlpack_round_trips_without_copies() -> None:
    data = np.arange(8, dtype=np.int32).reshape(2, 4)
    tensor = pb_utils.Tensor("T", data)
    from_capsule = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    from_protocol = torch.from_dlpack(tensor)  # through Tensor.__dlpack__ / __dlpack_device__
    for view in (from_capsule, from_protocol):
        assert view.data_ptr() == data.ctypes.data and view.tolist() == data.tolist()
    again = pb_utils.Tensor.from_dlpack("U", tensor.to_dlpack())
    assert again.as_numpy().ctypes.data == data.ctypes.data and again.name() == "U"
    assert np.from_dlpack(tensor).ctypes.data == data.ctypes.data


def test_triton_error_texts_for_what_dlpack_cannot_take() -> None:
    def refused(make: Any) -> str:
        with pytest.raises(pb_utils.TritonModelException) as caught:
            make()
        return str(caught.value)

    assert (
        refused(lambda: pb_utils.Tensor.from_dlpack("", np.ones(2)))
        == "Tensor name cannot be an empty string."
    )
    assert refused(lambda: pb_utils.Tensor.from_dlpack("X", [1.0, 2.0])) == (
        "Provided tensor is not supported. Tensor must be a DLPack capsule         "
        "or have `__dlpack__` and `__dlpack_device__` attributes"
    )
    transposed = torch.arange(6.0).reshape(2, 3).t()
    assert refused(lambda: pb_utils.Tensor.from_dlpack("X", transposed)) == (
        "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order are supported."
    )
    strings = pb_utils.Tensor("S", np.array([b"a", b"b"], dtype=np.object_))
    assert refused(strings.to_dlpack) == "DLPack does not have support for string tensors."
    opencl = _ProducerOn(np.ones(2, np.float32), (4, 0))  # kDLOpenCL
    assert refused(lambda: pb_utils.Tensor.from_dlpack("X", opencl)) == (
        "DLDevice type 4 is not support by Python backend."
    )


def test_a_capsule_is_consumed_once() -> None:
    capsule = torch.utils.dlpack.to_dlpack(torch.ones(3))
    pb_utils.Tensor.from_dlpack("A", capsule)
    with pytest.raises(pb_utils.TritonModelException, match="consumed only once"):
        pb_utils.Tensor.from_dlpack("B", capsule)


def test_pinned_host_memory_is_cpu_memory() -> None:
    pinned = pb_utils.Tensor.from_dlpack("P", _ProducerOn(np.arange(3, dtype=np.float32), (3, 0)))
    assert pinned.is_cpu() and pinned.as_numpy().tolist() == [0.0, 1.0, 2.0]


def test_a_tensor_in_gpu_memory_stays_there_and_refuses_numpy() -> None:
    data = np.arange(6, dtype=np.float16).reshape(3, 2)
    producer = _ProducerOn(data, (2, 0))  # reports kDLCUDA, device 0
    tensor = pb_utils.Tensor.from_dlpack("G", producer)
    assert not tensor.is_cpu() and tensor.__dlpack_device__() == (2, 0)
    assert tensor.shape() == [3, 2] and tensor.triton_dtype() == 10 and "cuda:0" in repr(tensor)
    assert producer.streams == [None]  # read on the legacy default stream, as Triton's stream=None
    with pytest.raises(pb_utils.TritonModelException) as caught:
        tensor.as_numpy()
    assert str(caught.value) == "Tensor is stored in GPU and cannot be converted to NumPy."
    # to_dlpack hands out the producer's own memory again, not a copy
    assert (
        np.from_dlpack(pb_utils.Tensor.from_dlpack("H", _ProducerOn(data, (1, 0)))).ctypes.data
        == data.ctypes.data
    )
    assert torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).data_ptr() == data.ctypes.data


@NO_CUDA
def test_cuda_tensors_stay_on_the_gpu() -> None:
    source = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    for given in (source, torch.utils.dlpack.to_dlpack(source)):
        tensor = pb_utils.Tensor.from_dlpack("G", given)
        assert not tensor.is_cpu() and tensor.__dlpack_device__() == (2, source.device.index)
        assert tensor.shape() == [3, 4] and tensor.triton_dtype() == 11
        with pytest.raises(pb_utils.TritonModelException, match="stored in GPU"):
            tensor.as_numpy()
        back = torch.from_dlpack(tensor.to_dlpack())
        assert back.is_cuda and back.data_ptr() == source.data_ptr()
        np.testing.assert_array_equal(tensor._host_array(), source.cpu().numpy())


@NO_CUDA
def test_cpu_tensors_reach_torch_cuda_through_dlpack() -> None:
    tensor = pb_utils.Tensor("T", np.arange(4, dtype=np.float32))
    on_gpu = torch.from_dlpack(tensor.to_dlpack()).cuda() * 2
    assert pb_utils.Tensor.from_dlpack("D", on_gpu)._host_array().tolist() == [0.0, 2.0, 4.0, 6.0]
