"""Small torch modules, scripted or exported by the tests (TorchScript needs their source file)."""

from __future__ import annotations

import torch


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Weighted(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y


class Halves(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"double": x * 2, "half": x / 2}


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class OnCuda(torch.nn.Module):
    """Ones where the input came to the module on a CUDA device, zeros where it came on the CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, float(x.is_cuda))


class Mlp(torch.nn.Module):
    """Two linear layers with a GELU between: a small model whose time goes to launching kernels."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class Synchronizing(torch.nn.Module):
    """Reads a value back to the host inside forward(): a CUDA graph cannot capture that."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float(x.sum())
