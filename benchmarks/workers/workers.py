"""One worker against N: the same server with --http-thread-count and --grpc-infer-thread-count
at 1 and at N, in alternating rounds.

    python -m benchmarks.workers.workers [--workers N] [--seconds 4] [--rounds 4] [--concurrency 1 32]
                                 [--paths http-json grpc python-json sequence-json compute-binary
                                          torch-binary openvino-binary openai-stream]
                                 [--results-name workers]
                                 [--load-threads T]

Both servers run at once on their own ports, serving the tiny add model of overhead.py, the
add-one model.py of python_speed.py and the streaming `charlm` of the OpenAI tests. The
`compute-binary` path sends HTTP binary requests to a model of four 512-wide dense layers with
ONNX Runtime's own thread count (a model that uses the cores itself); `torch-binary`, not run
unless named, the same layers as TorchScript (plugin-torch), and `openvino-binary` as
OpenVINO IR (plugin-openvino). The
`sequence-json` path sends HTTP JSON to the add model with a sequence batcher, each request a
sequence of its own: under workers only worker 0 serves it, and the others send it their
requests, so this row measures that hop. Each round
drives every path and concurrency on both, one first in even rounds and the other in odd ones,
so that a neighbour who slows the shared machine weighs on both. HTTP JSON goes through wrk,
gRPC through h2load (unary ModelInfer), each with `--load-threads` threads (default: a
quarter of the machine's cores, at least 1); OpenAI streaming through aiohttp clients in this
process (tokens/s: one Python process, so it measures less than the others). Each figure is
the median of its rounds; the ratio (N / 1) is the median of the per-round ratios. Writes
benchmarks/results/workers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from benchmarks.python.python_speed import JSON_BODY as PYTHON_JSON_BODY
from benchmarks.python.python_speed import MODEL as PYTHON_MODEL
from benchmarks.python.python_speed import write_repository as write_python_model
from benchmarks.support.load_generators import Load, grpc_call_succeeds, h2load_grpc, retrying, wrk
from benchmarks.support.models import write_model
from benchmarks.support.reporting import print_table, write_results
from benchmarks.support.trials import median
from benchmarks.transports.openai_stream import openai_stream_round
from benchmarks.transports.overhead import CONFIG, add_model, free_port, grpc_request, json_body
from coreserve.testing import ServerProcess
from support.servers.openai_repository import openai_repository, openai_url

PATHS = (
    "http-json", "grpc", "python-json", "sequence-json", "compute-binary", "torch-binary", "openvino-binary",
    "openai-stream",
)  # fmt: skip
# The twins of the compute model for plugin-torch and plugin-openvino: run where named.
TWINS = {"torch-binary": ("compute_torch", "OUTPUT__0"), "openvino-binary": ("compute_openvino", "OUTPUT0")}
DEFAULT_PATHS = [path for path in PATHS if path not in TWINS]
# A model whose inference is compute (four 512x512 layers over 64 rows), with ONNX Runtime's
# own thread count (none set): what workers do to a model that uses the cores itself.
COMPUTE_ROWS, COMPUTE_WIDTH, COMPUTE_LAYERS = 64, 512, 4
COMPUTE_CONFIG = f"""
backend: "onnxruntime"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {COMPUTE_ROWS}, {COMPUTE_WIDTH} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {COMPUTE_ROWS}, {COMPUTE_WIDTH} ] }} ]
"""
METHOD = "/inference.GRPCInferenceService/ModelInfer"
MAX_TOKENS = 64


def start(repository: Path, workers: int) -> ServerProcess:
    """A coreserve of `workers` workers on free ports (named: workers share them)."""
    ports = [
        f"--http-port={free_port()}",
        f"--grpc-port={free_port()}",
        f"--openai-port={free_port()}",
        f"--http-thread-count={workers}",
        f"--grpc-infer-thread-count={workers}",
        "--log-verbose=0",
    ]
    server = ServerProcess([repository], ports).start(timeout=180)
    deadline = time.monotonic() + 180
    while not _ready(server):  # every worker joined
        if time.monotonic() > deadline:
            raise SystemExit(f"the server of {workers} workers was not ready within 180 s:\n{server.log}")
        time.sleep(0.2)
    return server


def _ready(server: ServerProcess) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def measure(server: ServerProcess, path: str, concurrency: int, seconds: float, threads: int) -> Load:
    if path == "http-json":
        url = f"http://{server.http_url}/v2/models/add/infer"
        return retrying(lambda: wrk(url, concurrency, seconds, json_body(), threads=threads))
    if path == "sequence-json":
        url = f"http://{server.http_url}/v2/models/add_sequence/infer"
        return retrying(lambda: wrk(url, concurrency, seconds, sequence_body(), threads=threads))
    if path == "compute-binary" or path in TWINS:
        model, output = TWINS.get(path, ("compute", "OUTPUT0"))
        url = f"http://{server.http_url}/v2/models/{model}/infer"
        body, headers = compute_body(output)
        return retrying(lambda: wrk(url, concurrency, seconds, body, headers, threads=threads))
    if path == "python-json":
        url = f"http://{server.http_url}/v2/models/{PYTHON_MODEL}/infer"
        return retrying(lambda: wrk(url, concurrency, seconds, PYTHON_JSON_BODY, threads=threads))
    if path == "grpc":
        message = grpc_request().SerializeToString()  # type: ignore[attr-defined]
        return retrying(
            lambda: h2load_grpc(server.grpc_url, METHOD, message, concurrency, seconds, threads=threads)
        )
    done = asyncio.run(openai_stream_round(openai_url(server), concurrency, seconds, MAX_TOKENS))
    return Load(requests_per_s=done.tokens_per_second, p50_ms=done.ttft_ms_median,
                p90_ms=done.ttft_ms_p90, p99_ms=done.ttft_ms_p90, tool="aiohttp")  # fmt: skip


def compute_model() -> bytes:
    """COMPUTE_LAYERS dense layers (MatMul, Relu) of fixed random weights."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, previous = [], [], "INPUT0"
    for layer in range(COMPUTE_LAYERS):
        weight = rng.standard_normal((COMPUTE_WIDTH, COMPUTE_WIDTH), dtype=np.float32) / COMPUTE_WIDTH**0.5
        weights.append(numpy_helper.from_array(weight, f"W{layer}"))
        output = "OUTPUT0" if layer == COMPUTE_LAYERS - 1 else f"H{layer}"
        nodes.append(helper.make_node("MatMul", [previous, f"W{layer}"], [f"M{layer}"]))
        nodes.append(helper.make_node("Relu", [f"M{layer}"], [output]))
        previous = output
    shape = [COMPUTE_ROWS, COMPUTE_WIDTH]
    graph = helper.make_graph(
        nodes,
        "compute",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def write_torch_model(repository: Path) -> None:
    """The compute model's twin for plugin-torch: the same layers as TorchScript."""
    import warnings

    import torch

    class Dense(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            widths = [COMPUTE_WIDTH] * (COMPUTE_LAYERS + 1)
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(a, b, bias=False) for a, b in itertools.pairwise(widths)
            )

        def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:  # the input is named as the model's
            for layer in self.layers:
                INPUT0 = torch.relu(layer(INPUT0))
            return INPUT0

    folder = repository / "compute_torch"
    (folder / "1").mkdir(parents=True)
    with warnings.catch_warnings():  # torch deprecates TorchScript; Triton users still have model.pt files
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(Dense().eval(), torch.ones(COMPUTE_ROWS, COMPUTE_WIDTH))  # type: ignore[no-untyped-call]
        torch.jit.save(traced, str(folder / "1" / "model.pt"))
    config = COMPUTE_CONFIG.replace('"onnxruntime"', '"pytorch"').replace('"OUTPUT0"', '"OUTPUT__0"')
    (folder / "config.pbtxt").write_text(config)


def write_openvino_model(repository: Path) -> None:
    """The compute model's twin for plugin-openvino: the same ONNX graph as OpenVINO IR."""
    import openvino

    folder = repository / "compute_openvino"
    (folder / "1").mkdir(parents=True)
    source = repository / "compute_openvino.onnx"
    source.write_bytes(compute_model())
    openvino.save_model(openvino.convert_model(str(source)), str(folder / "1" / "model.xml"))
    source.unlink()
    (folder / "config.pbtxt").write_text(COMPUTE_CONFIG.replace('"onnxruntime"', '"openvino"'))


def compute_body(output: str = "OUTPUT0") -> tuple[bytes, dict[str, str]]:
    """The compute model's request in the binary extension (its tensor is 128 KiB)."""
    data = np.ones((COMPUTE_ROWS, COMPUTE_WIDTH), np.float32).tobytes()
    header = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "shape": [COMPUTE_ROWS, COMPUTE_WIDTH], "datatype": "FP32",
                        "parameters": {"binary_data_size": len(data)}}],
            "outputs": [{"name": output, "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return header + data, headers


def sequence_body() -> bytes:
    """The add model's JSON body as a whole sequence: the load generator numbers each one."""
    document = json.loads(json_body())
    document["parameters"] = {"sequence_id": 0, "sequence_start": True, "sequence_end": True}
    return json.dumps(document).replace('"sequence_id": 0', '"sequence_id": __SEQUENCE_ID__').encode()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cores = os.cpu_count() or 1
    parser.add_argument("--workers", type=int, default=cores, help="N (default: the machine's cores)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each trial")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of alternating trials")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=DEFAULT_PATHS)
    parser.add_argument("--results-name", default="workers", help="benchmarks/results/NAME.json")
    parser.add_argument("--load-threads", type=int, default=max(1, cores // 4))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repository = openai_repository(Path(folder) / "models")
        write_model(repository, "add", add_model(), CONFIG)
        write_model(repository, "add_sequence", add_model(), CONFIG + "sequence_batching { }\n")
        write_model(repository, "compute", compute_model(), COMPUTE_CONFIG)
        if "torch-binary" in args.paths:
            write_torch_model(repository)
        if "openvino-binary" in args.paths:
            write_openvino_model(repository)
        write_python_model(repository)
        servers = {1: start(repository, 1), args.workers: start(repository, args.workers)}
        try:
            for server in servers.values():
                grpc_call_succeeds(server.grpc_url, METHOD, grpc_request().SerializeToString())  # type: ignore[attr-defined]
            loads: dict[tuple[str, int, int], list[Load]] = {}
            for index in range(args.rounds):
                order = list(servers) if index % 2 == 0 else list(reversed(servers))
                for path in args.paths:
                    for concurrency in args.concurrency:
                        for workers in order:
                            load = measure(
                                servers[workers], path, concurrency, args.seconds, args.load_threads
                            )
                            if load.errors:  # a figure of failed requests measures nothing
                                raise SystemExit(
                                    f"{path} at {concurrency} on {workers} workers: {load.errors} requests failed"
                                )
                            loads.setdefault((path, concurrency, workers), []).append(load)
        finally:
            for server in servers.values():
                server.close()
    rows, results = [], []
    for path in args.paths:
        for concurrency in args.concurrency:
            one, many = loads[(path, concurrency, 1)], loads[(path, concurrency, args.workers)]
            ratios = [b.requests_per_s / a.requests_per_s for a, b in zip(one, many, strict=True)]
            p99_one, p99_many = median([a.p99_ms for a in one]), median([b.p99_ms for b in many])
            row = [path, concurrency, median([a.requests_per_s for a in one]),
                   median([b.requests_per_s for b in many]), median(ratios), min(ratios), max(ratios),
                   p99_one, p99_many]  # fmt: skip
            rows.append(row)
            results.append(dict(zip(COLUMNS, row, strict=True)))
    unit = "requests/s (openai-stream: tokens/s, p99: TTFT p90)"
    table = print_table(
        f"1 worker against {args.workers}, median of {args.rounds} alternating rounds of {args.seconds:g} s; {unit}",
        COLUMNS,
        rows,
    )
    print(f"\nwrote {write_results('workers', args, [table], {'results': results}, name=args.results_name)}")


COLUMNS = [
    "path",
    "concurrency",
    "1 worker",
    "N workers",
    "ratio",
    "ratio min",
    "ratio max",
    "p99 ms 1",
    "p99 ms N",
]

if __name__ == "__main__":
    main()
