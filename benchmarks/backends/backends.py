"""What serving costs each CPU backend: one MLP as ONNX, TorchScript and OpenVINO IR.

    python -m benchmarks.backends.backends [--seconds 5] [--trials 3] [--batches 1 16]

The same weights (FP32 [N, 512] through three 1024-wide dense layers with ReLU) are written
as model.onnx (onnxruntime), model.pt (TorchScript, pytorch) and model.xml/.bin (OpenVINO IR,
openvino). For each backend and batch size B, measured in one run: (a) the framework's own
in-process samples/s, one caller running batch B in a loop; (b) the server's samples/s with
16 concurrent HTTP binary requests of batch B each (wrk, one instance, no dynamic batching).
Trials alternate (a) and (b); each figure is the median of its trials. The ratio (b) / (a) is what the server keeps of the framework's throughput. Before timing,
the three served models are checked to give the same answer. Writes
benchmarks/results/backends.json.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.support.load_generators import Load, calls_per_second, wrk
from benchmarks.support.models import binary_infer_body, mlp_onnx, mlp_weights, start_server
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, median_load

WIDTH_IN, WIDTH, LAYERS, MAX_BATCH, CONCURRENCY = 512, 1024, 3, 16, 16
BACKENDS = {"onnxruntime": "model.onnx", "pytorch": "model.pt", "openvino": "model.xml"}
CONFIG = f"""
backend: "{{backend}}"
max_batch_size: {MAX_BATCH}
input [ {{{{ name: "x" data_type: TYPE_FP32 dims: [ {WIDTH_IN} ] }}}} ]
output [ {{{{ name: "y" data_type: TYPE_FP32 dims: [ {WIDTH} ] }}}} ]
instance_group [ {{{{ count: 1 kind: KIND_CPU }}}} ]
{{parameters}}
"""
# OpenVINO computes in bfloat16 on CPUs that have it; the comparison keeps every backend in FP32.
F32_HINT = {"INFERENCE_PRECISION_HINT": "f32"}


def write_torchscript(weights: list[tuple[np.ndarray, np.ndarray]], path: Path) -> None:
    import torch

    layers: list[torch.nn.Module] = []
    for weight, bias in weights:
        linear = torch.nn.Linear(*weight.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weight.T.copy()))
            linear.bias.copy_(torch.from_numpy(bias))
        layers += [linear, torch.nn.ReLU()]
    torch.jit.save(torch.jit.script(torch.nn.Sequential(*layers).eval()), str(path))


def write_openvino_ir(onnx_file: Path, path: Path) -> None:
    import openvino as ov

    ov.save_model(ov.convert_model(str(onnx_file)), str(path), compress_to_fp16=False)


def write_repository(repository: Path) -> dict[str, Path]:
    """One model folder per backend, named after it; returns each backend's model file."""
    weights = mlp_weights(WIDTH_IN, WIDTH, LAYERS)
    files = {}
    for backend, filename in BACKENDS.items():
        (repository / backend / "1").mkdir(parents=True)
        parameters = (
            'parameters { key: "INFERENCE_PRECISION_HINT" value: { string_value: "f32" } }'
            if backend == "openvino"
            else ""
        )
        (repository / backend / "config.pbtxt").write_text(
            CONFIG.format(backend=backend, parameters=parameters)
        )
        files[backend] = repository / backend / "1" / filename
    files["onnxruntime"].write_bytes(mlp_onnx(weights))
    write_torchscript(weights, files["pytorch"])
    write_openvino_ir(files["onnxruntime"], files["openvino"])
    return files


def in_process_runner(backend: str, model_file: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The framework's own call, as a user would make it without a server."""
    if backend == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
        return lambda x: session.run(["y"], {"x": x})[0]
    if backend == "pytorch":
        import torch

        module = torch.jit.load(str(model_file)).eval()  # type: ignore[no-untyped-call]

        def run_torch(x: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                result: np.ndarray = module(torch.from_numpy(x)).numpy()
                return result

        return run_torch
    import openvino as ov

    compiled = ov.Core().compile_model(str(model_file), "CPU", F32_HINT)
    request = compiled.create_infer_request()
    return lambda x: request.infer({"x": x})[compiled.output(0)]


def served_outputs_agree(http_url: str, reference: np.ndarray, sample: np.ndarray) -> dict[str, float]:
    """The largest difference between each served model's output and the in-process ONNX one."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http_url)
    differences = {}
    try:
        for backend in BACKENDS:
            tensor = httpclient.InferInput("x", list(sample.shape), "FP32")
            tensor.set_data_from_numpy(sample)
            output = client.infer(backend, [tensor]).as_numpy("y")
            differences[backend] = float(np.abs(output - reference).max())
    finally:
        client.close()
    worst = max(differences.values())
    if worst > 1e-3:
        raise SystemExit(f"the served models disagree (largest difference {worst}): {differences}")
    return differences


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one trial")
    parser.add_argument("--trials", type=int, default=3, help="trials per row (the median is reported)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, MAX_BATCH], help="batch sizes")
    args = parser.parse_args()
    if any(not 1 <= batch <= MAX_BATCH for batch in args.batches):
        parser.error(f"batch sizes must lie in 1..{MAX_BATCH}")

    repository = Path(tempfile.mkdtemp(prefix="coreserve-backends-")) / "models"
    files = write_repository(repository)

    sample = np.random.default_rng(2).normal(size=(4, WIDTH_IN)).astype(np.float32)
    runners = {backend: in_process_runner(backend, model_file) for backend, model_file in files.items()}
    reference = runners["onnxruntime"](sample)
    cases = [(backend, batch) for backend in BACKENDS for batch in args.batches]
    own_rates: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    server_runs: dict[tuple[str, int], list[Load]] = {case: [] for case in cases}
    server = start_server(repository, "--allow-metrics=false")
    try:
        differences = served_outputs_agree(server.http_url, reference, sample)
        requests = {}
        for backend, batch in cases:
            inputs = np.random.default_rng(1).normal(size=(batch, WIDTH_IN))
            requests[backend, batch] = binary_infer_body("x", inputs, "y")
            url = f"http://{server.http_url}/v2/models/{backend}/infer"
            wrk(url, CONCURRENCY, 2, *requests[backend, batch])  # warm-up
        # Each trial measures the framework alone and then the server, case after case, so that
        # a neighbour who slows the machine for a while weighs on both sides of each ratio.
        for _ in range(args.trials):
            for backend, batch in cases:
                x = np.ones((batch, WIDTH_IN), np.float32)
                rate = calls_per_second(partial(runners[backend], x), args.seconds / 2)
                own_rates[backend, batch].append(batch * rate)
                url = f"http://{server.http_url}/v2/models/{backend}/infer"
                server_runs[backend, batch].append(
                    wrk(url, CONCURRENCY, args.seconds, *requests[backend, batch])
                )
    finally:
        server.close()
    in_process = {
        backend: {batch: median(own_rates[backend, batch]) for batch in args.batches} for backend in BACKENDS
    }
    served = {
        backend: {batch: median_load(server_runs[backend, batch]) for batch in args.batches}
        for backend in BACKENDS
    }

    rows: list[list[object]] = []
    ratios: dict[str, dict[str, float]] = {}
    for backend in BACKENDS:
        for batch in args.batches:
            load = served[backend][batch]
            samples = load.requests_per_s * batch
            ratio = samples / in_process[backend][batch]
            ratios.setdefault(backend, {})[str(batch)] = ratio
            rows.append(
                [backend, batch, in_process[backend][batch], samples, ratio, load.p50_ms, load.p99_ms]
            )
    tables: list[Table] = []
    tables.append(
        print_table(
            f"MLP [N,{WIDTH_IN}] -> {LAYERS} x {WIDTH} ReLU: server at concurrency {CONCURRENCY} "
            "(HTTP binary, wrk) vs the framework in-process (median of trials)",
            [
                "backend",
                "batch",
                "in-process samples/s",
                "server samples/s",
                "server / in-process",
                "p50 ms",
                "p99 ms",
            ],
            rows,
        )
    )
    print(f"\nlargest output difference from in-process onnxruntime: {max(differences.values()):.2e}")
    path = write_results(
        "backends",
        args,
        tables,
        {
            "model": {"width_in": WIDTH_IN, "width": WIDTH, "layers": LAYERS},
            "concurrency": CONCURRENCY,
            "in_process_samples_per_s": {b: {str(k): v for k, v in r.items()} for b, r in in_process.items()},
            "server": {b: {str(k): v for k, v in r.items()} for b, r in served.items()},
            "server_to_in_process": ratios,
            "output_differences": differences,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
