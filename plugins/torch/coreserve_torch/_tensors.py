"""torch dtypes as coreserve datatypes, and numpy arrays to tensors and back."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from coreserve import DataType

TORCH_TYPES = {
    torch.bool: DataType.BOOL,
    torch.uint8: DataType.UINT8,
    torch.uint16: DataType.UINT16,
    torch.uint32: DataType.UINT32,
    torch.uint64: DataType.UINT64,
    torch.int8: DataType.INT8,
    torch.int16: DataType.INT16,
    torch.int32: DataType.INT32,
    torch.int64: DataType.INT64,
    torch.float16: DataType.FP16,
    torch.float32: DataType.FP32,
    torch.float64: DataType.FP64,
    torch.bfloat16: DataType.BF16,
}


def to_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A tensor over the array's memory where it can be (a copy for read-only arrays)."""
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array)  # torch wants memory it may write
    if array.dtype == ml_dtypes.bfloat16:
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device)


def to_array(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()
