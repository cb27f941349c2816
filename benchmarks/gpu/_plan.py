"""What a run measures and how long each stage may take: the device run's sizes, and the dry
run's (tiny models on the CPU, a second per figure) that exercise the same code."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# Each stage's share of --budget-s, in the order the stages run.
SHARES = {
    "networks": 0.09,
    "plugin_torch": 0.32,
    "cuda_graphs": 0.09,  # two pairs of points (2 x 2 x point_s, 32 s on the device) and slack
    "two_models": 0.04,  # one point of both models (the sweep measured each alone)
    "gpu_memory": 0.01,
    "python_backend": 0.22,
    "cpu_workers": 0.23,
}
STAGES = tuple(SHARES)


@dataclass(frozen=True)
class Plan:
    dry_run: bool
    device: str  # "cuda" or "cpu"
    budget_s: float
    # Torch's datatype and the configuration's.
    torch_dtype: str = "float16"
    config_dtype: str = "TYPE_FP16"
    image: tuple[int, int, int] = (3, 224, 224)
    resnet: str = "resnet50"  # torchvision's, or "tiny" (a small conv net)
    bert_hidden: int = 768
    bert_layers: int = 12
    bert_heads: int = 12
    bert_sequence: int = 128
    bert_vocabulary: int = 30522
    max_batch: int = 128
    queue_delay_us: int = 100
    concurrencies: tuple[int, ...] = (1, 4, 16, 64, 256)
    shm_concurrency: int = 16  # the CUDA shm target's concurrency: HTTP binary and shm are measured there
    pair_concurrency: int = 64  # two models at once, each at this
    window_ms: int = 1500  # perf_analyzer's measurement interval
    python_instances: int = 2
    python_concurrencies: tuple[int, ...] = (1, 16, 64, 256)
    cpu_workers: int = 16
    cpu_concurrency: int = 128
    cpu_rounds: int = 2
    in_process_repeats: int = 50
    cuda_graphs_parameter: str = "coreserve_cuda_graphs"
    seed: int = 0
    shares: dict[str, float] = field(default_factory=lambda: dict(SHARES))

    @property
    def kind(self) -> str:
        return "KIND_GPU" if self.device == "cuda" else "KIND_CPU"

    @property
    def saturation(self) -> int:
        return max(self.concurrencies)

    def budget(self, stage: str) -> float:
        return self.budget_s * self.shares[stage]


def device_plan(budget_s: float, cuda_graphs_parameter: str, cpu_workers: int) -> Plan:
    return Plan(
        dry_run=False,
        device="cuda",
        budget_s=budget_s,
        cuda_graphs_parameter=cuda_graphs_parameter,
        cpu_workers=cpu_workers,
    )


def dry_plan(budget_s: float, cuda_graphs_parameter: str) -> Plan:
    """Tiny models on the CPU in FP32, concurrency 1 and 2, short windows: seconds per stage."""
    return replace(
        Plan(dry_run=True, device="cpu", budget_s=budget_s, cuda_graphs_parameter=cuda_graphs_parameter),
        torch_dtype="float32",
        config_dtype="TYPE_FP32",
        image=(3, 16, 16),
        resnet="tiny",
        bert_hidden=32,
        bert_layers=2,
        bert_heads=2,
        bert_sequence=8,
        bert_vocabulary=100,
        max_batch=8,
        concurrencies=(1, 2),
        shm_concurrency=2,
        pair_concurrency=2,
        window_ms=400,
        python_instances=1,
        python_concurrencies=(1, 2),
        cpu_workers=2,
        cpu_concurrency=2,
        cpu_rounds=1,
        in_process_repeats=10,
    )
