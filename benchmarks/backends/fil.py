"""What serving a 500-tree forest costs on plugin-fil, and why it predicts with the frameworks' own code.

    python -m benchmarks.backends.fil [--seconds 4] [--trials 3] [--batches 1 1024]

Two binary classifiers of 500 trees on 32 FP32 features are trained here: XGBoost (depth 6,
served as xgboost.json) and LightGBM (63 leaves, served as model.txt), both with
`predict_proba`. For each model and batch size B, measured in one run: (a) rows/s of the
framework's own predictor in-process (what plugin-fil calls, with the threads it gives a batch
of B: one below 128 rows, every core from 128), one caller in a loop; (b) rows/s of Treelite's
GTIL on the same forest with as many threads (the predictor plugin-fil could have used); (c)
rows/s through the server, 8 concurrent HTTP binary requests of batch B (wrk, one instance, no
dynamic batching). Trials alternate (a), (b) and (c); each figure is the median of its trials.
The served answers are checked against the framework's before timing. Writes
benchmarks/results/fil.json.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import cast

import lightgbm
import numpy as np
import treelite
import xgboost

from benchmarks.support.load_generators import Load, calls_per_second, wrk
from benchmarks.support.models import binary_infer_body, start_server
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, median_load
from coreserve_fil._settings import FilSettings

TREES, FEATURES, CONCURRENCY, MAX_BATCH = 500, 32, 8, 1024
CONFIG = f"""
backend: "fil"
max_batch_size: {MAX_BATCH}
input [ {{{{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}}} ]
output [ {{{{ name: "output__0" data_type: TYPE_FP32 dims: [ 2 ] }}}} ]
instance_group [ {{{{ count: 1 kind: KIND_CPU }}}} ]
parameters {{{{ key: "model_type" value: {{{{ string_value: "{{model_type}}" }}}} }}}}
parameters {{{{ key: "output_class" value: {{{{ string_value: "true" }}}} }}}}
parameters {{{{ key: "predict_proba" value: {{{{ string_value: "true" }}}} }}}}
"""
# Each takes the rows and the threads to use (0: every core).
Predict = Callable[[np.ndarray, int], np.ndarray]


def plugin_threads(rows: int) -> int:
    """The threads plugin-fil gives a batch when the configuration sets no cpu_nthread."""
    return 0 if FilSettings().threads_for(rows) is None else 1


def train(repository: Path) -> dict[str, tuple[Predict, Predict]]:
    """Writes both models into `repository`; returns each one's (own predictor, Treelite GTIL)."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((5000, FEATURES)).astype(np.float32)
    target = (data[:, 0] + data[:, 1] * data[:, 2] + 0.3 * rng.standard_normal(5000) > 0).astype(int)
    booster = xgboost.train(
        {"objective": "binary:logistic", "max_depth": 6, "seed": 0}, xgboost.DMatrix(data, target), TREES
    )
    forest = lightgbm.train(
        {"objective": "binary", "num_leaves": 63, "verbose": -1},
        lightgbm.Dataset(data, target, params={"verbose": -1}),
        TREES,
    )
    for name, model_type, filename, content in (
        ("xgboost", "xgboost_json", "xgboost.json", bytes(booster.save_raw("json"))),
        ("lightgbm", "lightgbm", "model.txt", forest.model_to_string().encode()),
    ):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(CONFIG.format(model_type=model_type))
        (repository / name / "1" / filename).write_bytes(content)
    xgboost_gtil = treelite.frontend.from_xgboost(booster)
    lightgbm_gtil = treelite.frontend.from_lightgbm(forest)

    def lightgbm_predict(x: np.ndarray, threads: int) -> np.ndarray:
        return cast(np.ndarray, forest.predict(x, num_threads=threads))  # an array for a dense input

    def xgboost_predict(x: np.ndarray, threads: int) -> np.ndarray:
        booster.set_param({"nthread": threads})
        return booster.inplace_predict(x)

    def gtil(model: treelite.Model) -> Predict:
        return lambda x, threads: treelite.gtil.predict(model, x, nthread=threads or -1)

    return {
        "xgboost": (xgboost_predict, gtil(xgboost_gtil)),
        "lightgbm": (lightgbm_predict, gtil(lightgbm_gtil)),
    }


def served_answers_agree(http_url: str, predictors: dict[str, tuple[Predict, Predict]]) -> None:
    import tritonclient.http as httpclient

    sample = np.random.default_rng(3).standard_normal((64, FEATURES)).astype(np.float32)
    client = httpclient.InferenceServerClient(http_url)
    try:
        for name, (own, _) in predictors.items():
            tensor = httpclient.InferInput("input__0", list(sample.shape), "FP32")
            tensor.set_data_from_numpy(sample)
            served = client.infer(name, [tensor]).as_numpy("output__0")
            if served is None or not np.allclose(served[:, 1], own(sample, 1), rtol=1e-5):
                raise SystemExit(f"the served {name} model disagrees with {name} itself")
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="length of one trial")
    parser.add_argument("--trials", type=int, default=3, help="trials per row (the median is reported)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, MAX_BATCH], help="batch sizes")
    args = parser.parse_args()
    if any(not 1 <= batch <= MAX_BATCH for batch in args.batches):
        parser.error(f"batch sizes must lie in 1..{MAX_BATCH}")

    repository = Path(tempfile.mkdtemp(prefix="coreserve-fil-")) / "models"
    predictors = train(repository)
    cases = [(name, batch) for name in predictors for batch in args.batches]
    own: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    gtil: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    served: dict[tuple[str, int], list[Load]] = {case: [] for case in cases}
    server = start_server(repository, "--allow-metrics=false")
    try:
        served_answers_agree(server.http_url, predictors)
        rows = np.random.default_rng(1).standard_normal((MAX_BATCH, FEATURES)).astype(np.float32)
        bodies = {case: binary_infer_body("input__0", rows[: case[1]], "output__0") for case in cases}
        for name, batch in cases:
            wrk(f"http://{server.http_url}/v2/models/{name}/infer", CONCURRENCY, 1, *bodies[name, batch])
        for _ in range(args.trials):
            for name, batch in cases:
                x, threads = rows[:batch], plugin_threads(batch)
                own_predict, gtil_predict = predictors[name]
                for rates, predict in ((own, own_predict), (gtil, gtil_predict)):
                    rate = calls_per_second(partial(predict, x, threads), args.seconds / 3)
                    rates[name, batch].append(batch * rate)
                url = f"http://{server.http_url}/v2/models/{name}/infer"
                served[name, batch].append(wrk(url, CONCURRENCY, args.seconds, *bodies[name, batch]))
    finally:
        server.close()

    table, results = [], {}
    for name, batch in cases:
        load = median_load(served[name, batch])
        own_rows, gtil_rows = median(own[name, batch]), median(gtil[name, batch])
        served_rows = load.requests_per_s * batch
        table.append(
            [
                name,
                batch,
                own_rows,
                gtil_rows,
                own_rows / gtil_rows,
                served_rows,
                served_rows / own_rows,
                load.p50_ms,
                load.p99_ms,
            ]
        )
        results[f"{name}/{batch}"] = {
            "framework_rows_per_s": own_rows,
            "treelite_gtil_rows_per_s": gtil_rows,
            "served_rows_per_s": served_rows,
            "served_p50_ms": load.p50_ms,
            "served_p99_ms": load.p99_ms,
        }
    tables: list[Table] = []
    tables.append(
        print_table(
            f"{TREES}-tree binary classifiers, {FEATURES} features, predict_proba: the framework's own predictor "
            f"and Treelite GTIL in-process vs the server at concurrency {CONCURRENCY} (HTTP binary, wrk; median of trials)",
            [
                "model",
                "batch",
                "own rows/s",
                "GTIL rows/s",
                "own/GTIL",
                "served rows/s",
                "served/own",
                "p50 ms",
                "p99 ms",
            ],
            table,
        )
    )
    path = write_results(
        "fil",
        args,
        tables,
        {
            "trees": TREES,
            "features": FEATURES,
            "concurrency": CONCURRENCY,
            "trials": args.trials,
            "cases": results,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
