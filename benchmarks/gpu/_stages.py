"""The stages of the run, in order. Each takes the Session (what earlier stages left: the
networks, the GPU server, the sweep's figures) and its Stage (budget, figures)."""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu import _load, _networks, _repository, _servers
from benchmarks.gpu._plan import Plan
from benchmarks.gpu._record import Stage
from benchmarks.gpu._sampler import Sampler
from benchmarks.support.trials import median

# A perf_analyzer point takes its windows (3: every window is "stable" at 999%) plus its start.
POINT_WINDOWS = 4


@dataclass
class Session:
    plan: Plan
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu-bench-")))
    networks: dict[str, dict[str, Any]] = field(default_factory=dict)
    server: Any = None
    sampler: Sampler | None = None
    points: dict[tuple[str, str, int], _load.Point] = field(default_factory=dict)
    batch1: dict[str, dict[str, float]] = field(default_factory=dict)  # in process, ms

    @property
    def shm(self) -> str:
        return "cuda" if self.plan.device == "cuda" else "system"

    def point_s(self) -> float:
        return self.plan.window_ms / 1000 * POINT_WINDOWS + 2

    def gpu_server(self) -> Any:
        if self.server is None:
            if not self.networks:
                raise RuntimeError("no networks: the networks stage failed")
            repository = _repository.gpu_repository(self.plan, self.folder / "models", self.networks)
            models = [_repository.RESNET, _repository.RESNET_GRAPHS, _repository.BERT, _repository.RESNET_PY]
            self.server = _servers.coreserve(repository, models, "--metrics-interval-ms=500")
            self.sampler = Sampler(self.server.metrics_url).start()
        return self.server

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self.server is not None:
            self.server.close()
            self.server = None
        shutil.rmtree(self.folder, ignore_errors=True)


def _example(plan: Plan, model: str) -> Any:
    if model == _repository.BERT:
        return lambda batch: _networks.token_batch(plan, batch)
    return lambda batch: _networks.image_batch(plan, batch)


def networks(session: Session, stage: Stage) -> None:
    """Builds the networks on the device and times each at batch 1 in this process."""
    plan = session.plan
    session.networks = _networks.build(plan, session.folder)
    stage.put("networks", session.networks)
    for name, built in session.networks.items():
        stage.check()
        timer = _networks.in_process(plan, built["path"], _example(plan, name))
        session.batch1[name] = _networks.summary_ms(timer(1, plan.in_process_repeats))
        stage.put(f"{name}_in_process_batch1", session.batch1[name])


def _sweep(
    session: Session, stage: Stage, model: str, transport: str, concurrencies: tuple[int, ...]
) -> None:
    url = session.gpu_server().grpc_url if transport in ("grpc", "shm") else session.gpu_server().http_url
    for concurrency in concurrencies:
        stage.check(session.point_s())
        point = _load.measure(model, transport, url, concurrency, session.plan.window_ms, session.shm)
        session.points[(model, transport, concurrency)] = point
        stage.put(
            f"{model}_{transport}",
            [asdict(p) for k, p in session.points.items() if k[:2] == (model, transport)],
        )


def _in_process_limit(session: Session, stage: Stage, model: str, batches: dict[int, int]) -> dict[str, Any]:
    """The same module in this process at the batch sizes the batcher formed: the most frequent
    sizes (95% of the executions, 8 sizes at most), weighted by how often each was formed."""
    plan = session.plan
    ordered = sorted(batches.items(), key=lambda item: -item[1])
    total, kept, covered = sum(batches.values()), [], 0
    for size, count in ordered[:8]:
        kept.append((size, count))
        covered += count
        if covered >= 0.95 * total:
            break
    timer = _networks.in_process(plan, session.networks[_model_network(model)]["path"], _example(plan, model))
    seconds = {}
    for size, _ in kept:
        stage.check(2)
        seconds[size] = median(timer(size, max(5, plan.in_process_repeats // 5)))
    samples = sum(size * count for size, count in kept)
    busy = sum(seconds[size] * count for size, count in kept)
    return {"batches": {str(k): v for k, v in sorted(batches.items())}, "timed_batches": [k for k, _ in kept],
            "seconds_per_batch": {str(k): v for k, v in seconds.items()}, "infer_per_s": samples / busy}  # fmt: skip


def _model_network(model: str) -> str:
    return "bert" if model == _repository.BERT else "resnet50"


def plugin_torch(session: Session, stage: Stage) -> None:
    """plugin-torch's ResNet-50 and BERT from concurrency 1 to saturation over gRPC, each against
    the framework's limit in process; ResNet-50 over HTTP binary and shared memory at the shared
    memory target's concurrency (one point each: a sweep would not fit the stage's budget)."""
    plan = session.plan
    server = session.gpu_server()
    rows = []
    for model in (_repository.RESNET, _repository.BERT):
        before = _servers.batch_counts(server.http_url, model)
        _sweep(session, stage, model, "grpc", plan.concurrencies)
        after = _servers.batch_counts(server.http_url, model)
        # The batches of the sweep's last point (saturation) dominate; the whole sweep's are read.
        formed = {size: after.get(size, 0) - before.get(size, 0) for size in after}
        limit = _in_process_limit(session, stage, model, {k: v for k, v in formed.items() if v > 0})
        saturated = session.points[(model, "grpc", plan.saturation)]
        one = session.points[(model, "grpc", 1)]
        batch1 = session.batch1[_model_network(model)]["p50_ms"]
        figures = {
            "in_process_limit": limit,
            "ratio_to_in_process": saturated.infer_per_s / limit["infer_per_s"],
            "p99_at_1_ms": one.p99_ms,
            "in_process_batch1_p50_ms": batch1,
            "p99_at_1_over_in_process_ms": one.p99_ms - batch1,
        }
        stage.put(f"{model}_limit", figures)
        rows.append([model, plan.saturation, saturated.infer_per_s, limit["infer_per_s"],
                     figures["ratio_to_in_process"], one.p99_ms, batch1])  # fmt: skip
    stage.table(
        "plugin-torch at saturation (gRPC) against the module in process at the batches the batcher "
        "formed (infer/s); p99 at concurrency 1 against the module's batch-1 median (ms)",
        ["model", "concurrency", "server", "in process", "ratio", "p99 at 1", "in process batch 1"],
        rows,
    )
    for transport in ("http-binary", "shm"):
        _sweep(session, stage, _repository.RESNET, transport, (plan.shm_concurrency,))
    shm = session.points[(_repository.RESNET, "shm", plan.shm_concurrency)]
    http = session.points[(_repository.RESNET, "http-binary", plan.shm_concurrency)]
    stage.put("shm_over_http_binary", {"concurrency": plan.shm_concurrency, "kind": session.shm,
                                       "ratio": shm.infer_per_s / http.infer_per_s})  # fmt: skip
    stage.table(
        "plugin-torch, every point (perf_analyzer; infer/s, ms)",
        ["model", "transport", "concurrency", "infer/s", "p50", "p99"],
        [
            [p.model, p.transport, p.concurrency, p.infer_per_s, p.p50_ms, p.p99_ms]
            for p in session.points.values()
        ],
    )


def cuda_graphs(session: Session, stage: Stage) -> None:
    """The CUDA-graphs parameter on (the twin model) and off, at concurrency 1 and saturation,
    each pair measured back to back. The twin captured its graphs (every batch size up to
    max_batch) when the server loaded it, so nothing needs warming up here; the stage records
    the line in which the server said how long those captures took."""
    plan = session.plan
    server = session.gpu_server()
    url = server.grpc_url
    captured = re.findall(rf"model '{_repository.RESNET_GRAPHS}': instance '\S+' captured .*", server.log)
    stage.put("captured", captured)
    rows = []
    for concurrency in (1, plan.saturation):
        stage.check(2 * session.point_s())
        off = _load.measure(_repository.RESNET, "grpc", url, concurrency, plan.window_ms)
        on = _load.measure(_repository.RESNET_GRAPHS, "grpc", url, concurrency, plan.window_ms)
        row = {"concurrency": concurrency, "off": asdict(off), "on": asdict(on), "ratio": on.infer_per_s / off.infer_per_s,
               "p99_ratio": on.p99_ms / off.p99_ms}  # fmt: skip
        stage.put(f"concurrency_{concurrency}", row)
        rows.append([concurrency, off.infer_per_s, on.infer_per_s, row["ratio"], off.p99_ms, on.p99_ms])
    stage.put("parameter", plan.cuda_graphs_parameter if plan.device == "cuda" else "(none: CPU)")
    stage.table(f"plugin-torch ResNet-50, {plan.cuda_graphs_parameter} off and on (gRPC)",
                ["concurrency", "off infer/s", "on infer/s", "ratio", "off p99", "on p99"], rows)  # fmt: skip


def two_models(session: Session, stage: Stage) -> None:
    """ResNet-50 and BERT driven at once on the one GPU, each against its figure alone."""
    plan = session.plan
    url = session.gpu_server().grpc_url
    concurrency = plan.pair_concurrency
    stage.check(session.point_s())
    models = (_repository.RESNET, _repository.BERT)
    alone = {}
    for model in models:
        if (model, "grpc", concurrency) not in session.points:
            stage.check(2 * session.point_s())
            session.points[(model, "grpc", concurrency)] = _load.measure(
                model, "grpc", url, concurrency, plan.window_ms
            )
        alone[model] = session.points[(model, "grpc", concurrency)]
    both = _load.together([(model, "grpc", url, concurrency) for model in models], plan.window_ms)
    rows = []
    for model, point in zip(models, both, strict=True):
        ratio = point.infer_per_s / alone[model].infer_per_s
        stage.put(
            model,
            {
                "concurrency": concurrency,
                "alone": asdict(alone[model]),
                "together": asdict(point),
                "ratio": ratio,
            },
        )
        rows.append([model, concurrency, alone[model].infer_per_s, point.infer_per_s, ratio])
    stage.table("two models at once on one GPU (gRPC), each against itself alone",
                ["model", "concurrency", "alone infer/s", "together infer/s", "ratio"], rows)  # fmt: skip


def gpu_memory(session: Session, stage: Stage) -> None:
    """The readings the sampler took during the stages before: /metrics against NVML."""
    if session.sampler is None:
        raise RuntimeError("no sampler: the GPU server never started")
    session.sampler.stop()
    summary = session.sampler.summary()
    stage.put("summary", summary)
    rows = [[key, value] for key, value in summary.items() if key not in ("series", "errors")]
    stage.table("GPU readings: coreserve's /metrics against NVML during the load", ["figure", "value"], rows)


def python_backend(session: Session, stage: Stage) -> None:
    """The model.py ResNet-50 (torch through DLPack) in coreserve and in the real Triton, the
    same instances, alternating at each concurrency."""
    plan = session.plan
    ours = session.gpu_server()
    repository = _repository.resnet_py(plan, session.folder / "triton-models", session.networks)
    theirs = _servers.triton(repository, [_repository.RESNET_PY])
    try:
        rows = []
        for index, concurrency in enumerate(plan.python_concurrencies):
            stage.check(2 * session.point_s())
            sides = {"coreserve": ours.grpc_url, "triton": theirs.grpc_url}
            order = list(sides) if index % 2 == 0 else list(reversed(sides))
            got = {
                side: _load.measure(_repository.RESNET_PY, "grpc", sides[side], concurrency, plan.window_ms)
                for side in order
            }
            ratio = got["coreserve"].infer_per_s / got["triton"].infer_per_s
            stage.put(
                f"concurrency_{concurrency}",
                {"coreserve": asdict(got["coreserve"]), "triton": asdict(got["triton"]), "ratio": ratio},
            )
            rows.append([concurrency, got["coreserve"].infer_per_s, got["triton"].infer_per_s, ratio,
                         got["coreserve"].p99_ms, got["triton"].p99_ms])  # fmt: skip
        stage.put("instances", plan.python_instances)
        stage.table("model.py ResNet-50 (DLPack): coreserve's python backend against the real Triton 2.51 (gRPC)",
                    ["concurrency", "coreserve infer/s", "triton infer/s", "ratio", "coreserve p99", "triton p99"], rows)  # fmt: skip
    finally:
        theirs.close()
        session.close()  # the GPU stages are over: the CPU comparison gets the machine


def cpu_workers(session: Session, stage: Stage) -> None:
    """The add-one model.py at high concurrency: coreserve with N workers (--http-thread-count,
    --grpc-infer-thread-count) against the real Triton with as many instances, HTTP JSON and
    gRPC, alternating rounds."""
    from benchmarks.workers.workers import start as start_workers

    plan = session.plan
    folder = Path(tempfile.mkdtemp(prefix="gpu-bench-cpu-"))
    servers: dict[str, Any] = {}
    try:
        ours = _repository.add_one_repository(folder / "ours", 1)  # one instance per worker
        theirs = _repository.add_one_repository(folder / "theirs", plan.cpu_workers)
        servers["coreserve"] = start_workers(ours, plan.cpu_workers)
        _servers.wait_ready(servers["coreserve"].http_url, ["add_one"])
        servers["triton"] = _servers.triton(theirs, ["add_one"], f"--http-thread-count={plan.cpu_workers}")
        loads: dict[tuple[str, str], list[_load.Point]] = {}
        for index in range(plan.cpu_rounds):
            for transport in ("http-json", "grpc"):
                order = list(servers) if index % 2 == 0 else list(reversed(servers))
                for side in order:
                    stage.check(session.point_s())
                    url = servers[side].grpc_url if transport == "grpc" else servers[side].http_url
                    point = _load.measure("add_one", transport, url, plan.cpu_concurrency, plan.window_ms)
                    loads.setdefault((side, transport), []).append(point)
        rows = []
        for transport in ("http-json", "grpc"):
            ours_points, theirs_points = loads[("coreserve", transport)], loads[("triton", transport)]
            ratios = [a.infer_per_s / b.infer_per_s for a, b in zip(ours_points, theirs_points, strict=False)]
            figure = {"concurrency": plan.cpu_concurrency, "coreserve": [asdict(p) for p in ours_points],
                      "triton": [asdict(p) for p in theirs_points], "ratio": median(ratios)}  # fmt: skip
            stage.put(transport, figure)
            rows.append([transport, plan.cpu_concurrency, median([p.infer_per_s for p in ours_points]),
                         median([p.infer_per_s for p in theirs_points]), figure["ratio"]])  # fmt: skip
        stage.put("workers", plan.cpu_workers)
        stage.table(f"add-one model.py on the CPU: coreserve with {plan.cpu_workers} workers against the real Triton "
                    f"with {plan.cpu_workers} instances", ["transport", "concurrency", "coreserve", "triton", "ratio"], rows)  # fmt: skip
    finally:
        for server in servers.values():
            server.close()
        shutil.rmtree(folder, ignore_errors=True)


STAGES = {
    "networks": networks,
    "plugin_torch": plugin_torch,
    "cuda_graphs": cuda_graphs,
    "two_models": two_models,
    "gpu_memory": gpu_memory,
    "python_backend": python_backend,
    "cpu_workers": cpu_workers,
}
