"""How close `coreserve analyze --search quick` gets to brute force, and at what cost.

    python -m benchmarks.analyze.analyze_search [--max-batch-size 8] [--max-instance-count 3]

Issue 36's target: quick reaches >= 95% of brute's best throughput within the latency budget,
with <= a third of brute's measurements, on an MLP (FP32 [N, 256] through two 512-wide
layers) and the examples' text classifier. Each model is analyzed twice in one run, brute then
quick, over the same bounds and budget. The settings quick picks are then looked up in brute's
own measurements too, so the comparison does not hang on one run's noise alone. A measurement
is one load level of one configuration (a line of the analysis checkpoint).
Writes benchmarks/results/analyze_search.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.support.models import mlp_onnx, mlp_weights, write_model
from benchmarks.support.reporting import print_table, write_results

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLES = REPOSITORY / "examples" / "model_repository"
MLP_CONFIG = """
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 512 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def run_analysis(repository: Path, model: str, search: str, out_dir: Path, args: argparse.Namespace) -> None:
    command = [
        sys.executable, "-m", "coreserve", "analyze",
        "--model-repository", str(repository), "--model", model, "--search", search,
        "--output-dir", str(out_dir), "--latency-budget-ms", str(args.latency_budget_ms),
        "--max-batch-size", str(args.max_batch_size), "--max-instance-count", str(args.max_instance_count),
        "--queue-delays-us", args.queue_delays_us, "--max-concurrency", str(args.max_concurrency),
        "--window-seconds", str(args.window_seconds),
    ]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=3600)


def points(out_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out_dir / "checkpoint.jsonl").read_text().splitlines()[1:]]


def best(found: list[dict[str, Any]], budget: float) -> dict[str, Any] | None:
    passing = [p for p in found if not p["error"] and p["p99_ms"] <= budget]
    return max(passing, key=lambda p: p["throughput"], default=None)


def compare(repository: Path, model: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    runs = {}
    for search in ("brute", "quick"):
        out_dir = work / f"{model}-{search}"
        run_analysis(repository, model, search, out_dir, args)
        runs[search] = points(out_dir)
    brute_best = best(runs["brute"], args.latency_budget_ms)
    quick_best = best(runs["quick"], args.latency_budget_ms)
    same_in_brute = best(
        [p for p in runs["brute"] if quick_best and p["settings"] == quick_best["settings"]],
        args.latency_budget_ms,
    )
    return {
        "model": model,
        "brute_best": brute_best,
        "quick_best": quick_best,
        "quick_choice_in_brute": same_in_brute,
        "brute_measurements": len(runs["brute"]),
        "quick_measurements": len(runs["quick"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--max-instance-count", type=int, default=3)
    parser.add_argument("--queue-delays-us", default="0")
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--window-seconds", type=float, default=0.5)
    parser.add_argument("--latency-budget-ms", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        repository = work / "repository"
        write_model(repository, "mlp", mlp_onnx(mlp_weights(256, 512, 2)), MLP_CONFIG)
        results = [compare(repository, "mlp", args, work), compare(EXAMPLES, "text_classifier", args, work)]
    rows = []
    for result in results:
        brute_best, quick_best, again = (
            result["brute_best"],
            result["quick_best"],
            result["quick_choice_in_brute"],
        )
        top = brute_best["throughput"] if brute_best else float("nan")
        rows.append(
            [
                result["model"],
                round(top),
                round(quick_best["throughput"]) if quick_best else "none",
                f"{quick_best['throughput'] / top:.2f}" if quick_best and brute_best else "n/a",
                f"{again['throughput'] / top:.2f}" if again and brute_best else "n/a",
                result["brute_measurements"],
                result["quick_measurements"],
                f"{result['quick_measurements'] / result['brute_measurements']:.2f}",
            ]
        )
    table = print_table(
        f"analyze: quick against brute (p99 within {args.latency_budget_ms:g} ms)",
        [
            "model",
            "brute best infer/s",
            "quick best infer/s",
            "quick/brute",
            "quick's choice in brute's run/brute",
            "brute measurements",
            "quick measurements",
            "quick/brute measurements",
        ],
        rows,
    )
    write_results("analyze_search", args, [table], {"results": results})


if __name__ == "__main__":
    main()
