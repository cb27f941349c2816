"""Whether a GPU test can run here: a CUDA build of torch that sees a device, and NVML."""

from __future__ import annotations


def gpu_0_unusable() -> str:
    """Why a test cannot use GPU 0 through torch and watch it through NVML ("" where it can)."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
    except ImportError as exc:
        return f"needs {exc.name} (a CUDA build of torch and nvidia-ml-py)"
    except Exception as exc:  # NVMLError: installed, but no driver or GPU
        return f"NVML is not usable here ({exc})"
    pynvml.nvmlShutdown()
    return "" if torch.cuda.is_available() else "no CUDA device (a CUDA build of torch and an NVIDIA GPU)"
