"""What a Python model's process boundary costs: identity models, Python stub vs ONNX Runtime.

    python -m benchmarks.python.python_ipc [--requests 200]

The same identity model as a Triton model.py (plugin-python: tensors cross to the stub
process and back through shared memory) and as ONNX (runs in the server process). For 1 KiB
and 16 MiB FP32 tensors it measures, over sequential gRPC requests: the server's own time per
request (compute input + infer + output, from the statistics extension) and the client's
round-trip latency (median). The difference between the two models is the IPC overhead.
Writes benchmarks/results/python_ipc.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from benchmarks.support.models import identity_onnx, start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results

CONFIG = """
backend: "{backend}"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""
PYTHON_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
"""
SIZES = {"1 KiB": 256, "16 MiB": 4 * 1024 * 1024}


def server_ns_per_request(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
    total = sum(int(stats[k].get("ns", 0)) for k in ("compute_input", "compute_infer", "compute_output"))
    return total, int(stats["compute_infer"].get("count", 0))


def measure(
    client: grpcclient.InferenceServerClient, model: str, elements: int, requests: int
) -> dict[str, float]:
    data = np.random.default_rng(0).normal(size=elements).astype(np.float32)
    tensor = grpcclient.InferInput("INPUT0", [elements], "FP32")
    tensor.set_data_from_numpy(data)
    for _ in range(3):  # warm-up
        client.infer(model, [tensor])
    before_ns, before_count = server_ns_per_request(client, model)
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        result = client.infer(model, [tensor])
        latencies.append(time.perf_counter() - started)
    assert np.array_equal(result.as_numpy("OUTPUT0"), data)
    after_ns, after_count = server_ns_per_request(client, model)
    return {
        "server_us": (after_ns - before_ns) / (after_count - before_count) / 1000,
        "round_trip_ms": statistics.median(latencies) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=int, default=200, help="requests per model and size (16 MiB: a tenth)"
    )
    args = parser.parse_args()

    repository = Path(tempfile.mkdtemp(prefix="coreserve-ipc-")) / "models"
    write_model(repository, "identity_onnx", identity_onnx(), CONFIG.format(backend="onnxruntime"))
    (repository / "identity_python" / "1").mkdir(parents=True)
    (repository / "identity_python" / "config.pbtxt").write_text(CONFIG.format(backend="python"))
    (repository / "identity_python" / "1" / "model.py").write_text(PYTHON_MODEL)

    server = start_server(repository, "--allow-metrics=false")
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for label, elements in SIZES.items():
            count = args.requests if elements < 1_000_000 else max(10, args.requests // 10)
            results[label] = {
                model: measure(client, model, elements, count)
                for model in ("identity_onnx", "identity_python")
            }
        client.close()
    finally:
        server.close()

    rows = []
    for label, by_model in results.items():
        onnx, python = by_model["identity_onnx"], by_model["identity_python"]
        rows.append(
            [
                label,
                onnx["server_us"],
                python["server_us"],
                python["server_us"] - onnx["server_us"],
                onnx["round_trip_ms"],
                python["round_trip_ms"],
            ]
        )
    tables: list[Table] = []
    tables.append(
        print_table(
            "Identity model, sequential gRPC requests: ONNX (in process) vs Python (stub process)",
            [
                "tensor",
                "onnx server us",
                "python server us",
                "IPC overhead us",
                "onnx round trip ms",
                "python round trip ms",
            ],
            rows,
        )
    )
    path = write_results("python_ipc", args, tables, {"results": results})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
