"""gRPC over TLS: the native server against grpcio, and against plain gRPC, on the tiny add model.

    python -m benchmarks.transports.grpc_tls_speed [--seconds 6] [--rounds 3]

Three coreserve processes serve the add model (two FP32 [1, 4] inputs, see overhead.py):
`--grpc-server native` with `--grpc-use-ssl`, `--grpc-server grpcio` with it, and native without
TLS. h2load (Debian's nghttp2-client) drives unary ModelInfer on each at concurrency 8 and 32,
one connection per stream, in an order that rotates from round to round; each figure is the
median of its rounds, each ratio the median of the per-round ratios. The certificate is a
self-signed one that `openssl` makes for 127.0.0.1. Writes benchmarks/results/grpc_tls_speed.json.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.support.load_generators import Load, h2load_grpc, retrying
from benchmarks.support.models import start_server, write_model
from benchmarks.support.reporting import Table, print_table, write_results
from benchmarks.support.trials import median, rotated
from benchmarks.transports.overhead import CONFIG, add_model

CONCURRENCIES = (8, 32)
METHOD = "/inference.GRPCInferenceService/ModelInfer"
NATIVE_TLS, GRPCIO_TLS, NATIVE_PLAIN = "native TLS", "grpcio TLS", "native plain"


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by openssl."""
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def add_message() -> bytes:
    """One serialized ModelInferRequest for the add model."""
    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelInferRequest(model_name="add")
    for name in ("INPUT0", "INPUT1"):
        tensor = message.inputs.add(name=name, datatype="FP32")
        tensor.shape.extend([1, 4])
        message.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    return bytes(message.SerializeToString())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="length of one trial")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating trials")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="coreserve-grpc-tls-"))
    repository = folder / "models"
    write_model(repository, "add", add_model(), CONFIG)
    cert, key = self_signed(folder)
    tls = ["--grpc-use-ssl=true", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}"]
    common = ["--allow-http=false", "--allow-metrics=false"]
    servers = {
        NATIVE_TLS: start_server(repository, *common, "--grpc-server=native", *tls),
        GRPCIO_TLS: start_server(repository, *common, "--grpc-server=grpcio", *tls),
        NATIVE_PLAIN: start_server(repository, *common, "--grpc-server=native"),
    }
    message = add_message()
    paths = tuple(servers)

    def drive(path: str, concurrency: int) -> Load:
        load = h2load_grpc(
            servers[path].grpc_url, METHOD, message, concurrency, args.seconds, tls=path != NATIVE_PLAIN
        )
        if load.errors:  # h2load sees HTTP statuses; a refused handshake shows as no answers at all
            raise RuntimeError(f"{path}: {load.errors} calls failed")
        return load

    rates: dict[str, dict[int, list[float]]] = {path: {c: [] for c in CONCURRENCIES} for path in paths}
    try:
        for round_index in range(args.rounds):
            for concurrency in CONCURRENCIES:
                order = rotated(paths, round_index)
                for path in order:
                    run: Callable[[], Load] = partial(drive, path, concurrency)
                    load = retrying(run)
                    rates[path][concurrency].append(load.requests_per_s)
                    print(
                        f"round {round_index + 1} c={concurrency} {path}: {load.requests_per_s:,.0f}/s",
                        flush=True,
                    )
    finally:
        for server in servers.values():
            server.close()

    rows = []
    ratios: dict[str, dict[str, float]] = {}
    for concurrency in CONCURRENCIES:
        native = rates[NATIVE_TLS][concurrency]
        over_grpcio = [n / g for n, g in zip(native, rates[GRPCIO_TLS][concurrency], strict=True)]
        over_plain = [n / p for n, p in zip(native, rates[NATIVE_PLAIN][concurrency], strict=True)]
        ratios[str(concurrency)] = {
            "native_tls_over_grpcio_tls": median(over_grpcio),
            "native_tls_over_plain": median(over_plain),
        }
        for path in paths:
            values = rates[path][concurrency]
            rows.append([path, concurrency, median(values), f"{min(values):,.0f}-{max(values):,.0f}"])
        print(
            f"c={concurrency}: native TLS / grpcio TLS {median(over_grpcio):.2f} "
            f"({min(over_grpcio):.2f}-{max(over_grpcio):.2f}), native TLS / plain {median(over_plain):.2f}"
        )
    tables: list[Table] = []
    tables.append(
        print_table(
            f"Tiny add model, unary ModelInfer, h2load, median of {args.rounds} alternating rounds",
            ["server", "concurrency", "req/s", "range"],
            rows,
        )
    )
    results = write_results(
        "grpc_tls_speed",
        args,
        tables,
        {
            "requests_per_s_by_round": {p: {str(c): v for c, v in by_c.items()} for p, by_c in rates.items()},
            "ratios": ratios,
        },
    )
    print(f"results: {results}")


if __name__ == "__main__":
    main()
