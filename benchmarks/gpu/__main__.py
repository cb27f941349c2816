"""python -m benchmarks.gpu [--dry-run] [--output PATH] [--budget-s 480]: see the package's docstring."""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import Any

from benchmarks.gpu import __doc__ as DESCRIPTION
from benchmarks.gpu import _stages
from benchmarks.gpu._plan import STAGES, device_plan, dry_plan
from benchmarks.gpu._record import Record, Stage
from benchmarks.support.reporting import RESULTS

# figure (a path into the stages' figures), the bound, and whether it is a floor or a ceiling.
TARGETS = (
    ("plugin-torch ResNet-50 / in process at saturation", ("plugin_torch", "resnet50_limit", "ratio_to_in_process"), 0.9, ">="),
    ("plugin-torch BERT / in process at saturation", ("plugin_torch", "bert_limit", "ratio_to_in_process"), 0.9, ">="),
    ("plugin-torch ResNet-50 p99 at 1 - in-process batch 1 (ms)", ("plugin_torch", "resnet50_limit", "p99_at_1_over_in_process_ms"), 1.0, "<="),
    ("plugin-torch BERT p99 at 1 - in-process batch 1 (ms)", ("plugin_torch", "bert_limit", "p99_at_1_over_in_process_ms"), 1.0, "<="),
    ("shared memory / HTTP binary, one image", ("plugin_torch", "shm_over_http_binary", "ratio"), 2.0, ">="),
    ("two models at once: ResNet-50 / alone", ("two_models", "resnet50", "ratio"), 0.8, ">="),
    ("two models at once: BERT / alone", ("two_models", "bert", "ratio"), 0.8, ">="),
    ("model.py ResNet-50: coreserve / Triton at saturation", ("python_backend", "saturation", "ratio"), 1.2, ">="),
    ("CPU, HTTP JSON: coreserve workers / Triton", ("cpu_workers", "http-json", "ratio"), 1.5, ">="),
    ("CPU, gRPC: coreserve workers / Triton", ("cpu_workers", "grpc", "ratio"), 1.5, ">="),
)  # fmt: skip


def _find(stages: dict[str, dict[str, Any]], path: tuple[str, ...]) -> float | None:
    value: Any = stages
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) else None


def targets(record: Record, stage: Stage) -> None:
    """Each target beside the figure the run measured for it, and whether it was met."""
    stages = {s.name: s.figures for s in record.stages}
    python = stages.get("python_backend", {})
    keys = [k for k in python if k.startswith("concurrency_")]
    if keys:  # the model.py target reads the highest concurrency measured
        python["saturation"] = python[max(keys, key=lambda k: int(k.split("_")[1]))]
    rows, found = [], []
    for name, path, bound, sense in TARGETS:
        value = _find(stages, path)
        met = None if value is None else (value >= bound if sense == ">=" else value <= bound)
        found.append({"figure": name, "value": value, "target": f"{sense} {bound:g}", "met": met})
        rows.append(
            [
                name,
                "-" if value is None else value,
                f"{sense} {bound:g}",
                {None: "not measured", True: "yes", False: "no"}[met],
            ]
        )
    stage.put("targets", found)
    stage.table("targets", ["figure", "measured", "target", "met"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--dry-run", action="store_true", help="tiny models on the CPU: every path, in seconds"
    )
    parser.add_argument("--output", type=Path, help="the results file (default: benchmarks/results/gpu-h200.json; "
                        "with --dry-run, gpu-dry-run.json)")  # fmt: skip
    parser.add_argument(
        "--budget-s", type=float, default=None, help="the whole run's time (default 480; dry run 150)"
    )
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES), help="run only these")
    parser.add_argument("--cuda-graphs-parameter", default="coreserve_cuda_graphs",
                        help="plugin-torch's configuration parameter that turns CUDA graphs on")  # fmt: skip
    parser.add_argument(
        "--cpu-workers", type=int, default=os.cpu_count() or 1, help="the CPU comparison's workers"
    )
    args = parser.parse_args()
    if args.dry_run:
        plan = dry_plan(args.budget_s or 150, args.cuda_graphs_parameter)
    else:
        plan = device_plan(args.budget_s or 480, args.cuda_graphs_parameter, args.cpu_workers)
    output = args.output or RESULTS / ("gpu-dry-run.json" if args.dry_run else "gpu-h200.json")
    record = Record(output, {**vars(args), "output": str(output)}, plan.__dict__)
    session = _stages.Session(plan)
    try:
        for name in STAGES:
            if name in args.stages:
                record.run(name, plan.budget(name), functools.partial(_stages.STAGES[name], session))
    finally:
        session.close()
    record.run("targets", 10, functools.partial(targets, record))
    print(
        f"\nwrote {output}" + (f"; stages that failed: {', '.join(record.errors)}" if record.errors else "")
    )


if __name__ == "__main__":
    main()
