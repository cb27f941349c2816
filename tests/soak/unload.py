"""A bounded soak of model unloading: memory, descriptors, threads and stubs given back.

    python tests/soak/unload.py [--cycles 100] [--minutes 15] [--infers 3]
                                [--backends onnxruntime,python,...] [--rss-growth-mb 50]

For each installed backend (onnxruntime, pytorch, openvino, python, fil, tensorflow; one whose
plugin or framework is not installed is skipped with the reason printed) it starts a `coreserve`
of its own on 127.0.0.1 in explicit model-control mode, over a repository of two models built
for it: a tiny working one and a corrupt one (garbage bytes as its model file, or a model.py
whose initialize raises). Then, through the repository API:

- `--cycles` times: load the working model, send `--infers` requests and check each answer,
  unload it;
- `--cycles` times: load the corrupt model, which must fail.

After each unload (and each failed load) it samples the server process: resident memory,
open descriptors (/proc/PID/fd), threads and child processes (Python model stubs). A backend
passes when, after the last cycle, RSS is within `--rss-growth-mb` of what it was after the
first (the first cycle pays for importing the framework and its caches, which the process keeps),
descriptors are back to their count after the first cycle, threads too (give or take the event
loop's default executor, whose workers start as needed and stay: no more than its bound), and no
child process is left beyond those the server had before the first load. `--minutes` bounds each
backend's run: a backend that runs out of time reports the cycles it did. Writes
benchmarks/results/unload.json and prints a table; exits 1 if a backend fails. Linux only (/proc).

The models are built in processes of their own (as the TensorFlow tests build theirs) with the
tests' own builders, so that no framework is imported into this process. pytest does not
collect this script (no `test_` prefix); tests/e2e/repository/test_unload_memory.py is its short version
for CI.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.testing import ServerProcess

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# Seconds a sample waits for stubs, threads and descriptors to be given back before it is taken.
SETTLE_S = 10.0
# The event loop's default executor's most workers (concurrent.futures.ThreadPoolExecutor's default).
EXECUTOR_THREADS = min(32, (os.cpu_count() or 1) + 4)

ADD_SUB_TENSORS = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

PYTHON_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

BROKEN_PYTHON_MODEL = """
import numpy


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this model is broken on purpose (the unload soak)")
"""

# Builders, each run as `python -c CODE FOLDER` with tests/ on sys.path: they write FOLDER/good
# (config.pbtxt, 1/<model file>) and, where the answer is the framework's, FOLDER/expected.npy.
BUILD_ONNX = """
import sys
from pathlib import Path
from support.model_builders import add_sub_model
folder = Path(sys.argv[1]) / "good" / "1"
folder.mkdir(parents=True)
(folder / "model.onnx").write_bytes(add_sub_model().SerializeToString())
"""

BUILD_TORCH = """
import sys, warnings
from pathlib import Path
sys.path.insert(0, "plugins/torch")
import torch
from torch_models import AddSub
folder = Path(sys.argv[1]) / "good" / "1"
folder.mkdir(parents=True)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    torch.jit.save(torch.jit.script(AddSub()), str(folder / "model.pt"))
"""

BUILD_OPENVINO = """
import sys
from pathlib import Path
import openvino as ov
import openvino.opset13 as ops
a = ops.parameter([-1, 4], ov.Type.f32, name="INPUT0")
b = ops.parameter([-1, 4], ov.Type.f32, name="INPUT1")
total, difference = ops.add(a, b), ops.subtract(a, b)
total.output(0).get_tensor().set_names({"OUTPUT0"})
difference.output(0).get_tensor().set_names({"OUTPUT1"})
folder = Path(sys.argv[1]) / "good" / "1"
folder.mkdir(parents=True)
ov.save_model(ov.Model([total, difference], [a, b], "add_sub"), str(folder / "model.xml"))
"""

BUILD_FIL = """
import sys
from pathlib import Path
import numpy as np
import xgboost
sys.path.insert(0, "plugins/fil")
from forest_builders import samples, xgboost_booster
booster = xgboost_booster("reg:squarederror")
folder = Path(sys.argv[1]) / "good" / "1"
folder.mkdir(parents=True)
(folder / "xgboost.json").write_bytes(bytes(booster.save_raw("json")))
expected = booster.predict(xgboost.DMatrix(samples(1, seed=7)))
np.save(Path(sys.argv[1]) / "expected.npy", expected.astype(np.float32).reshape(1, 1))
"""

BUILD_TENSORFLOW = """
import sys
from pathlib import Path
sys.path.insert(0, "plugins/tensorflow")
import tf_model_builders
built = Path(sys.argv[1]) / "built"
tf_model_builders.two_signatures(built)
(built / "signatures").rename(Path(sys.argv[1]) / "good")
"""


@dataclass(frozen=True)
class BackendCase:
    """A backend's working and corrupt model, and the requests that check the working one."""

    backend: str  # the name `coreserve backends` lists
    modules: tuple[str, ...]  # its plugin and framework, which must be importable
    build: str  # the builder's code (see BUILD_ONNX)
    config: str  # the working model's config.pbtxt
    corrupt_files: dict[str, bytes]  # version 1's files of the corrupt model
    corrupt_config: str
    inputs: dict[str, np.ndarray]
    output: str
    expected: Callable[[Path], np.ndarray]  # from the build folder

    def missing(self) -> str:
        """What is not installed for it, in words ("" if everything is)."""
        absent = [name for name in self.modules if importlib.util.find_spec(name) is None]
        return f"not installed: {', '.join(absent)}" if absent else ""


A = np.arange(4, dtype=np.float32).reshape(1, 4)
B = np.full((1, 4), 0.5, dtype=np.float32)
ADD_SUB_INPUTS = {"INPUT0": A, "INPUT1": B}
GARBAGE = b"\x00 these bytes are not a model \xff" * 64


def _add(_: Path) -> np.ndarray:
    return A + B


def _fil_samples() -> np.ndarray:
    # forest_builders.samples(1, seed=7), without importing XGBoost here.
    data = np.random.default_rng(7).standard_normal((1, 6)).astype(np.float32)
    data[::7, 2] = np.nan
    return data


def _config(backend: str, tensors: str = ADD_SUB_TENSORS) -> str:
    return f'backend: "{backend}"\n{tensors}'


FIL_CONFIG = """backend: "fil"
max_batch_size: 8
input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "model_type" value: { string_value: "xgboost_json" } }
parameters { key: "output_class" value: { string_value: "false" } }
"""
TENSORFLOW_CONFIG = """backend: "tensorflow"
max_batch_size: 8
parameters { key: "TF_NUM_INTRA_THREADS" value: { string_value: "1" } }
parameters { key: "TF_NUM_INTER_THREADS" value: { string_value: "1" } }
"""
TF_INPUT = np.arange(4, dtype=np.float32).reshape(1, 4)

CASES = {
    case.backend: case
    for case in (
        BackendCase(
            "onnxruntime",
            ("coreserve_onnx", "onnxruntime", "onnx"),
            BUILD_ONNX,
            _config("onnxruntime"),
            {"model.onnx": GARBAGE},
            _config("onnxruntime"),
            ADD_SUB_INPUTS,
            "OUTPUT0",
            _add,
        ),
        BackendCase(
            "pytorch",
            ("coreserve_torch", "torch"),
            BUILD_TORCH,
            _config("pytorch"),
            {"model.pt": GARBAGE},
            _config("pytorch"),
            ADD_SUB_INPUTS,
            "OUTPUT0",
            _add,
        ),
        BackendCase(
            "openvino",
            ("coreserve_openvino", "openvino"),
            BUILD_OPENVINO,
            _config("openvino"),
            {"model.xml": GARBAGE, "model.bin": GARBAGE},
            _config("openvino"),
            ADD_SUB_INPUTS,
            "OUTPUT0",
            _add,
        ),
        BackendCase(
            "python",
            ("coreserve_python",),
            "",  # its model.py is written as it is, below
            _config("python"),
            {"model.py": BROKEN_PYTHON_MODEL.encode()},
            _config("python"),
            ADD_SUB_INPUTS,
            "OUTPUT0",
            _add,
        ),
        BackendCase(
            "fil",
            ("coreserve_fil", "xgboost"),
            BUILD_FIL,
            FIL_CONFIG,
            {"xgboost.json": GARBAGE},
            FIL_CONFIG,
            {"input__0": _fil_samples()},
            "output__0",
            lambda folder: np.load(folder / "expected.npy"),
        ),
        BackendCase(
            "tensorflow",
            ("coreserve_tensorflow", "tensorflow"),
            BUILD_TENSORFLOW,
            TENSORFLOW_CONFIG,
            {"model.savedmodel/saved_model.pb": GARBAGE},
            TENSORFLOW_CONFIG,
            {"x": TF_INPUT},
            "y",
            lambda _: 2 * TF_INPUT,
        ),
    )
}


def build_repository(case: BackendCase, folder: Path) -> tuple[Path, np.ndarray]:
    """Writes FOLDER/repository with the models `good` and `corrupt`; returns it and the answer
    the working model must give."""
    repository = folder / "repository"
    repository.mkdir(parents=True)
    if case.build:
        subprocess.run(
            [sys.executable, "-c", case.build, str(repository)],
            check=True,
            capture_output=True,
            timeout=600,
            cwd=TESTS,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])},
        )
        expected_file = repository / "expected.npy"
        if expected_file.exists():
            expected_file.rename(folder / "expected.npy")
        built = repository / "built"
        if built.exists():
            built.rmdir()
    else:
        (repository / "good" / "1").mkdir(parents=True)
        (repository / "good" / "1" / "model.py").write_text(PYTHON_MODEL)
    (repository / "good" / "config.pbtxt").write_text(case.config)
    (repository / "corrupt").mkdir()
    (repository / "corrupt" / "config.pbtxt").write_text(case.corrupt_config)
    for name, content in case.corrupt_files.items():
        path = repository / "corrupt" / "1" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return repository, case.expected(folder)


@dataclass
class Sample:
    """The server's resources at one moment."""

    rss_mb: float
    fds: int
    threads: int
    children: int


def sample(pid: int) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return Sample(
        rss_mb=round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(fields["Threads"]),
        children=len(child_processes(pid)),
    )


def child_processes(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is `pid`."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(entry))
    return children


def settled_sample(pid: int, target: Sample | None, settle_s: float = SETTLE_S) -> Sample:
    """A sample once children, descriptors and threads are down to `target`'s (stubs take a
    moment to exit, threads to end), or after `settle_s` seconds, whichever comes first."""
    deadline = time.monotonic() + settle_s
    while True:
        now = sample(pid)
        if target is None or time.monotonic() > deadline:
            return now
        if now.children <= target.children and now.fds <= target.fds and now.threads <= target.threads:
            return now
        time.sleep(0.1)


@dataclass
class Run:
    """What one kind of cycle (working or corrupt model) did to the server's resources."""

    backend: str
    kind: str  # "load, infer, unload" or "failed load"
    before: Sample  # before the first load
    first: Sample | None = None  # after the first cycle
    last: Sample | None = None  # after the last
    loaded_rss_mb: list[float] = field(default_factory=list)  # while loaded, after the infers
    after: list[Sample] = field(default_factory=list)  # after each cycle
    cycles: int = 0
    wrong_answers: int = 0
    errors: list[str] = field(default_factory=list)

    def failures(self, rss_growth_mb: float) -> list[str]:
        """Why the run fails, in words (empty if it passes)."""
        if self.first is None or self.last is None:
            return [*self.errors] or ["no cycle completed"]
        found = list(self.errors)
        if self.wrong_answers:
            found.append(f"{self.wrong_answers} wrong answers")
        if self.last.rss_mb - self.first.rss_mb > rss_growth_mb:
            found.append(
                f"RSS grew by {self.last.rss_mb - self.first.rss_mb:.1f} MB (bound {rss_growth_mb:g})"
            )
        if self.last.fds > self.first.fds:
            found.append(f"{self.last.fds - self.first.fds} more open descriptors")
        # The event loop's default executor (asyncio.to_thread) starts a worker when two calls
        # overlap, by chance, up to its bound, and keeps it: more threads than after the first
        # cycle are a leak when they pass that bound (one thread per cycle passes it soon).
        if self.last.threads > self.first.threads + EXECUTOR_THREADS:
            found.append(
                f"{self.last.threads - self.first.threads} more threads (the default executor "
                f"may add {EXECUTOR_THREADS})"
            )
        if self.last.children > self.before.children:
            found.append(f"{self.last.children - self.before.children} child processes left")
        return found


def cycle_loads(
    server: ServerProcess,
    backend: str,
    inputs: dict[str, np.ndarray],
    output: str,
    expected: np.ndarray,
    cycles: int,
    infers: int,
    deadline: float,
) -> Run:
    """Loads, checks with `infers` requests and unloads the model `good`, `cycles` times."""
    assert server.process is not None
    pid = server.process.pid
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    run = Run(backend, "load, infer, unload", settled_sample(pid, None))
    try:
        while run.cycles < cycles and time.monotonic() < deadline:
            client.load_model("good")
            for _ in range(infers):
                tensors = []
                for name, value in inputs.items():
                    tensor = httpclient.InferInput(name, list(value.shape), "FP32")
                    tensor.set_data_from_numpy(value)
                    tensors.append(tensor)
                answer = client.infer("good", tensors).as_numpy(output)
                if answer is None or not np.allclose(answer, expected, rtol=1e-5, atol=1e-5):
                    run.wrong_answers += 1
                    if len(run.errors) < 3:
                        run.errors.append(f"cycle {run.cycles + 1}: {output} = {answer}, not {expected}")
            if run.cycles in (0, cycles - 1):
                run.loaded_rss_mb.append(sample(pid).rss_mb)
            client.unload_model("good")
            _end_cycle(run, pid)
    except InferenceServerException as exc:
        run.errors.append(f"cycle {run.cycles + 1}: {exc}")
    finally:
        client.close()
    _settle_last(run, pid)
    return run


def cycle_failed_loads(server: ServerProcess, backend: str, cycles: int, deadline: float) -> Run:
    """Loads the model `corrupt`, which must fail, `cycles` times."""
    assert server.process is not None
    pid = server.process.pid
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    run = Run(backend, "failed load", settled_sample(pid, None))
    try:
        while run.cycles < cycles and time.monotonic() < deadline:
            try:
                client.load_model("corrupt")
            except InferenceServerException as exc:
                if "load failed" not in str(exc) and len(run.errors) < 3:
                    run.errors.append(f"cycle {run.cycles + 1}: not a load failure: {exc}")
            else:
                run.errors.append(f"cycle {run.cycles + 1}: the corrupt model loaded")
                break
            _end_cycle(run, pid)
    finally:
        client.close()
    _settle_last(run, pid)
    return run


def _end_cycle(run: Run, pid: int) -> None:
    """Samples after a cycle, once its stubs have exited (a moment more after the first cycle,
    whose sample is the baseline); the last sample settles fully (see `_settle_last`)."""
    run.cycles += 1
    now = settled_sample(pid, Sample(0, 10**9, 10**9, run.before.children))
    if run.first is None:
        time.sleep(1.0)
        now = sample(pid)
        run.first = now
    run.after.append(now)
    run.last = now


def _settle_last(run: Run, pid: int) -> None:
    if run.first is not None:
        run.last = settled_sample(pid, run.first)
        run.after[-1] = run.last


@contextmanager
def explicit_server(repository: Path, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """A coreserve on 127.0.0.1 over `repository`, in explicit model-control mode, nothing loaded."""
    server = ServerProcess(
        [repository], ["--model-control-mode=explicit", "--log-verbose=0", "--allow-grpc=false"], env=env
    )
    server.start(timeout=180)
    try:
        yield server
    finally:
        server.close()


def soak_backend(case: BackendCase, cycles: int, infers: int, minutes: float) -> tuple[list[Run], int]:
    """Both kinds of cycle over a server of the backend's own; returns the runs and the count
    of tracebacks the server logged beyond those of the failed loads."""
    with tempfile.TemporaryDirectory(prefix=f"unload-{case.backend}-") as scratch:
        repository, expected = build_repository(case, Path(scratch))
        deadline = time.monotonic() + minutes * 60
        with explicit_server(repository) as server:
            working = cycle_loads(
                server, case.backend, case.inputs, case.output, expected, cycles, infers, deadline
            )
            failing = cycle_failed_loads(server, case.backend, cycles, deadline)
            return [working, failing], server.log.count("Traceback")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cycles", type=int, default=100, help="loads of each kind per backend (default 100)"
    )
    parser.add_argument(
        "--minutes", type=float, default=15.0, help="time bound per backend, both kinds (default 15)"
    )
    parser.add_argument("--infers", type=int, default=3, help="checked requests after each load (default 3)")
    parser.add_argument(
        "--backends", default=",".join(CASES), help=f"comma-separated (default: {','.join(CASES)})"
    )
    parser.add_argument(
        "--rss-growth-mb",
        type=float,
        default=50.0,
        help="RSS growth, last cycle over first, that fails (default 50)",
    )
    args = parser.parse_args(argv)

    # Its tables and results file are the benchmarks' kind.
    sys.path.insert(0, str(REPO))
    from benchmarks.support.reporting import print_table, write_results

    runs: list[Run] = []
    skipped: dict[str, str] = {}
    tracebacks: dict[str, int] = {}
    for name in args.backends.split(","):
        case = CASES[name]
        if reason := case.missing():
            print(f"{name}: skipped ({reason})", flush=True)
            skipped[name] = reason
            continue
        print(f"{name}: {args.cycles} cycles of each kind ...", flush=True)
        started = time.monotonic()
        backend_runs, tracebacks[name] = soak_backend(case, args.cycles, args.infers, args.minutes)
        runs += backend_runs
        print(f"{name}: done in {time.monotonic() - started:.0f} s", flush=True)

    rows = []
    verdicts: dict[str, list[str]] = {}
    for run in runs:
        failures = run.failures(args.rss_growth_mb)
        verdicts[f"{run.backend}: {run.kind}"] = failures
        first, last = run.first, run.last
        rows.append(
            [
                run.backend,
                run.kind,
                run.cycles,
                run.before.rss_mb,
                first.rss_mb if first else "-",
                last.rss_mb if last else "-",
                round(last.rss_mb - first.rss_mb, 1) if first and last else "-",
                f"{first.fds}→{last.fds}" if first and last else "-",
                f"{first.threads}→{last.threads}" if first and last else "-",
                f"{run.before.children}→{last.children}" if last else "-",
                "ok" if not failures else "FAIL: " + "; ".join(failures),
            ]
        )
    table = print_table(
        "Server resources after unloading, per backend (RSS in MB; fds, threads: after the first cycle → "
        "after the last; children: before the first load → after the last)",
        [
            "backend",
            "cycle",
            "cycles",
            "RSS before",
            "after first",
            "after last",
            "growth",
            "fds",
            "threads",
            "children",
            "verdict",
        ],
        rows,
    )
    path = write_results(
        "unload",
        args,
        [table],
        {
            "runs": [asdict(run) for run in runs],
            "skipped": skipped,
            "tracebacks_in_log": tracebacks,
            "failures": {key: value for key, value in verdicts.items() if value},
        },
    )
    print(f"results: {path}")
    failed = [key for key, value in verdicts.items() if value]
    if failed:
        print("FAILED: " + "; ".join(f"{key} ({'; '.join(verdicts[key])})" for key in failed))
        raise SystemExit(1)
    print("PASSED: every backend gave back what it took")


if __name__ == "__main__":
    main()
