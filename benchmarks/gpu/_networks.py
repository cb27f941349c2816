"""The networks, built from code with random weights of a fixed seed: ResNet-50 (torchvision)
and a BERT-base encoder (transformers), or their tiny stand-ins for the dry run; saved as
TorchScript for plugin-torch and the model.py, and timed in this process as the framework's
limit (the same file, the same host-to-device and device-to-host copies the server makes)."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gpu._plan import Plan


def _resnet(plan: Plan) -> Any:
    import torch

    if plan.resnet == "tiny":
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 10),
        )
    import torchvision

    return torchvision.models.resnet50(weights=None)


def _bert(plan: Plan) -> tuple[Any, str]:
    """The encoder module and what it is: transformers' BertModel where installed, else a
    BERT-shaped torch.nn.TransformerEncoder (the dry run on machines without transformers).
    Its forward(INPUT__0) takes token ids [N, S], any integers (taken modulo the vocabulary,
    since load generators send random ones), and returns the pooled output [N, hidden]."""
    import torch

    vocabulary = plan.bert_vocabulary

    try:
        from transformers import BertConfig, BertModel
    except ImportError:
        encoder_layer = torch.nn.TransformerEncoderLayer(
            plan.bert_hidden, plan.bert_heads, 4 * plan.bert_hidden, batch_first=True
        )

        class Encoder(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embedding = torch.nn.Embedding(vocabulary, plan.bert_hidden)
                self.position = torch.nn.Parameter(torch.randn(plan.bert_sequence, plan.bert_hidden) * 0.02)
                self.encoder = torch.nn.TransformerEncoder(
                    encoder_layer, plan.bert_layers, enable_nested_tensor=False
                )
                self.pooler = torch.nn.Linear(plan.bert_hidden, plan.bert_hidden)

            def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
                hidden = self.encoder(self.embedding(INPUT__0.remainder(vocabulary)) + self.position)
                return torch.tanh(self.pooler(hidden[:, 0]))

        return Encoder(), "torch.nn.TransformerEncoder (transformers is not installed)"

    config = BertConfig(
        vocab_size=vocabulary,
        hidden_size=plan.bert_hidden,
        num_hidden_layers=plan.bert_layers,
        num_attention_heads=plan.bert_heads,
        intermediate_size=4 * plan.bert_hidden,
        max_position_embeddings=max(512, plan.bert_sequence),
        torchscript=True,
    )
    bert = BertModel(config)

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=INPUT__0.remainder(vocabulary))[1]  # type: ignore[no-any-return]

    return Pooled(), "transformers BertModel"


def build(plan: Plan, folder: Path) -> dict[str, dict[str, Any]]:
    """Builds both networks, saves each as TorchScript (`<name>.pt` in `folder`) and says
    what each is: {name: {"path", "kind", "parameters", "build_s"}}."""
    import torch

    torch.manual_seed(plan.seed)
    dtype = getattr(torch, plan.torch_dtype)
    built = {}
    for name, (module, kind), example in (
        ("resnet50", (_resnet(plan), plan.resnet), image_batch(plan, 2)),
        ("bert", _bert(plan), token_batch(plan, 2)),
    ):
        started = time.monotonic()
        module = module.eval().to(device=plan.device, dtype=dtype)
        path = folder / f"{name}.pt"
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module, torch.from_numpy(example).to(plan.device), check_trace=False)  # type: ignore[no-untyped-call]
            torch.jit.save(traced, str(path))
        built[name] = {
            "path": str(path),
            "kind": kind,
            "parameters": sum(p.numel() for p in module.parameters()),
            "build_s": round(time.monotonic() - started, 2),
        }
        del module, traced
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    return built


def image_batch(plan: Plan, batch: int) -> np.ndarray:
    """Random images [batch, 3, H, W] in the plan's datatype (never zeros: METHOD.md)."""
    numpy_dtype = np.float16 if plan.torch_dtype == "float16" else np.float32
    return np.random.default_rng(plan.seed).standard_normal((batch, *plan.image)).astype(numpy_dtype)


def token_batch(plan: Plan, batch: int) -> np.ndarray:
    return np.random.default_rng(plan.seed).integers(
        0, plan.bert_vocabulary, (batch, plan.bert_sequence), dtype=np.int64
    )


def in_process(
    plan: Plan, path: str, example: Callable[[int], np.ndarray]
) -> Callable[[int, int], list[float]]:
    """A timer of the saved module in this process: timer(batch, repeats) -> seconds per call,
    each call taking a host array to the device, running forward() and bringing the result
    back to the host, as plugin-torch does for one batch."""
    import torch

    module = torch.jit.load(path, map_location=plan.device)  # type: ignore[no-untyped-call]
    device = torch.device(plan.device)

    def timer(batch: int, repeats: int) -> list[float]:
        host = example(batch)
        times = []
        with torch.inference_mode():
            for index in range(repeats + 3):
                started = time.perf_counter()
                out = module(torch.from_numpy(host).to(device))
                out.cpu().numpy()
                if index >= 3:  # warm-up: the first calls compile and allocate
                    times.append(time.perf_counter() - started)
        return times

    return timer


def summary_ms(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1000,
    }
