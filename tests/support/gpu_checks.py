"""Whether a GPU test can run here: a CUDA build of torch that sees a device, and NVML.

The reasons start as .ci/allowed-skips expects a GPU test's skip to start ("no CUDA:", "no NVML:").
"""

from __future__ import annotations


def gpu_0_unusable() -> str:
    """Why a test cannot use GPU 0 through torch and watch it through NVML ("" where it can)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA: torch sees no CUDA device (a CUDA build of torch and an NVIDIA GPU)"
    try:
        import pynvml

        pynvml.nvmlInit()
    except ImportError:
        return "no NVML: needs nvidia-ml-py"
    except Exception as exc:  # NVMLError: installed, but no driver or GPU
        return f"no NVML: NVML is not usable here ({exc})"
    pynvml.nvmlShutdown()
    return ""
