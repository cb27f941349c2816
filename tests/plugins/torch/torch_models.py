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


class HeavySynchronizing(torch.nn.Module):
    """Synchronizing with weights of `size` floats: what a failed capture could leave on the GPU."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float(x.sum()) + self.weight[0]


class Cumulative(torch.nn.Module):
    """Three cumulative sums alive at once (no fuser merges them) and a small result: a model
    whose graphs' memory is what they compute in between, not their inputs or outputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.cumsum(x, 1)
        b = torch.cumsum(a, 1)
        c = torch.cumsum(b, 1)
        return (a + b + c).sum(1, keepdim=True)
