"""Builds what the device run needs and the device lacks, run here before the device call:

    python -m benchmarks.gpu.pack [--output .gpu-carry] [--python 3.12]

.gpu-carry/ (ignored by git; name it in the device call's `carry`) then holds gpu-pack.tar.xz
and manifest.json. The archive holds:
- triton/: the real Triton 2.51 from the nvidia-pytriton 0.7.0 wheel that
  shared/tools/real-tritonserver installed, trimmed to the tritonserver binary, its libraries
  (nvidia_pytriton.libs, less the wheel's own libpython), the python backend and the stubs of
  --python and of this Python; stub-site/<python>/, numpy 1.26 for --python (the stub of 2.51
  mis-sizes tensors under numpy 2, which the device has);
- perf_analyzer/: perf_analyzer 2.51 from the tritonclient wheel ($PERF_ANALYZER's venv), with
  the CUDA runtime and libb64 it links against, and a wrapper that finds them;
- site/: wheels for --python from PyPI: the core's dependencies that the device lacks (httptools,
  hpack, orjson, protobuf, python-rapidjson), what the tests of the GPU paths need there too
  (tritonclient and plotly as tests/requirements.txt pins them, geventhttpclient with gevent),
  so that .ci/gpu-tests runs there; and the metadata of core-server and the plugins it serves
  with (torch, python, onnx, tensorrt: their entry points; the code itself comes from the tree,
  which device-run.sh puts first on PYTHONPATH).
It prints the archive's size and what travels in all (the tree's files and the archive), which
must stay under the device tool's 64 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu._record import REPOSITORY, git_commit
from benchmarks.gpu._servers import triton_root
from benchmarks.support.load_generators import perf_analyzer

LIMIT_MIB = 64
# The core's and tritonclient's needs that the device's image (KINDS.md's list) lacks.
WHEELS = ("httptools", "hpack", "orjson", "protobuf==6.33.6", "python-rapidjson")
# What the tests of the GPU paths (.ci/gpu-tests) need there besides: tritonclient.http's client,
# and the tests' own versions of tritonclient (2.51's, beside perf_analyzer, needs the
# `cuda.cudart` that the device's cuda-python 13 no longer has) and of plotly (analyze's report).
TEST_WHEELS = ("geventhttpclient", "gevent", "greenlet", "zope.event", "zope.interface", "brotli")
TESTS_PINNED = ("tritonclient", "plotly")
STUB_NUMPY = "numpy==1.26.4"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _pip_target(target: Path, python: str, *requirements: str) -> None:
    """Installs wheels for the device's Python into `target`, without their dependencies."""
    platforms = [f"--platform={p}" for p in PLATFORMS]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
                    f"--python-version={python}", "--implementation=cp", *platforms,
                    f"--target={target}", "--no-compile", *requirements], check=True)  # fmt: skip


def _triton(build: Path, python: str) -> None:
    root = triton_root()
    if root is None:
        raise SystemExit("the real Triton is not installed: run shared/tools/real-tritonserver --help once")
    server, destination = root / "pytriton" / "tritonserver", build / "triton" / "pytriton" / "tritonserver"
    (destination / "bin").mkdir(parents=True)
    shutil.copy2(server / "bin" / "tritonserver", destination / "bin")
    shutil.copytree(server / "backends" / "python", destination / "backends" / "python",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for version in sorted({python, here}):
        shutil.copytree(
            server / "python_backend_stubs" / version, destination / "python_backend_stubs" / version
        )
    shutil.copytree(root / "nvidia_pytriton.libs", build / "triton" / "nvidia_pytriton.libs",
                    ignore=shutil.ignore_patterns("libpython3*"))  # fmt: skip
    _pip_target(build / "triton" / "stub-site" / python, python, STUB_NUMPY)


def _perf_analyzer(build: Path) -> None:
    wrapper = perf_analyzer()
    if wrapper is None:
        raise SystemExit(
            "perf_analyzer is not installed ($PERF_ANALYZER; .ci/install-test-tools installs it)"
        )
    venv = Path(wrapper).resolve().parent / "venv"
    binary = venv / "bin" / "perf_analyzer"
    runtime = next(venv.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    destination = build / "perf_analyzer"
    (destination / "lib").mkdir(parents=True)
    shutil.copy2(binary, destination / "perf_analyzer.bin")
    shutil.copy2(next(runtime.glob("libcudart.so.12*")), destination / "lib" / "libcudart.so.12")
    shutil.copy2(Path("/lib/x86_64-linux-gnu/libb64.so.0d").resolve(), destination / "lib" / "libb64.so.0d")
    (destination / "perf_analyzer").write_text(
        '#!/bin/sh\nhere=$(dirname "$(readlink -f "$0")")\n'
        'LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$here/perf_analyzer.bin" "$@"\n'
    )
    (destination / "perf_analyzer").chmod(0o755)


def _tests_pins() -> list[str]:
    """The tests' pins (tests/requirements.txt) of TESTS_PINNED, without extras."""
    pins = {}
    for line in (REPOSITORY / "tests" / "requirements.txt").read_text().splitlines():
        requirement = re.split(r"[#;]", line, maxsplit=1)[0].strip()  # no comment, no marker
        name = re.split(r"[\[=<>~! ]", requirement, maxsplit=1)[0]
        if name in TESTS_PINNED:
            pins[name] = re.sub(r"\[.*?\]", "", requirement)
    missing = set(TESTS_PINNED) - set(pins)
    if missing:
        raise SystemExit(f"tests/requirements.txt pins no {', '.join(sorted(missing))}")
    return list(pins.values())


def _site(build: Path, python: str) -> None:
    _pip_target(build / "site", python, *WHEELS, *TEST_WHEELS, *_tests_pins())
    metadata = build / "metadata"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", f"--target={metadata}",
                    str(REPOSITORY / "core"), str(REPOSITORY / "plugins" / "torch"), str(REPOSITORY / "plugins" / "python"),
                    str(REPOSITORY / "plugins" / "onnx"), str(REPOSITORY / "plugins" / "tensorrt")],
                   check=True)  # fmt: skip
    for info in metadata.glob("*.dist-info"):  # the metadata only: the tree holds the code
        shutil.copytree(info, build / "site" / info.name)
    shutil.rmtree(metadata)


def _tree_bytes() -> int:
    """What of the tree travels: tracked files and untracked ones that git does not ignore."""
    listed = subprocess.run(["git", "-C", str(REPOSITORY), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout  # fmt: skip
    paths = {REPOSITORY / name for name in listed.decode().split("\0") if name}
    return sum(path.stat().st_size for path in paths if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", type=Path, default=REPOSITORY / ".gpu-carry")
    parser.add_argument("--python", default="3.12", help="the device's Python (KINDS.md: 3.12.3)")
    args = parser.parse_args()
    started = time.monotonic()
    build = args.output / "build"
    shutil.rmtree(args.output, ignore_errors=True)
    build.mkdir(parents=True)
    _triton(build, args.python)
    _perf_analyzer(build)
    _site(build, args.python)
    dirty = subprocess.run(["git", "-C", str(REPOSITORY), "status", "--porcelain", "--", "core", "plugins"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    manifest = {"commit": git_commit(), "tree_changed": bool(dirty), "python": args.python,
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wheels": [*WHEELS, *TEST_WHEELS, *_tests_pins(), STUB_NUMPY]}  # fmt: skip
    (build / "manifest.json").write_text(json.dumps(manifest, indent=2))
    archive = args.output / "gpu-pack.tar.xz"
    subprocess.run(["tar", "-C", str(build), "-cf", str(archive), "-I", "xz -9 -T2", "."], check=True,
                   env={**os.environ, "XZ_OPT": ""})  # fmt: skip
    unpacked = sum(path.stat().st_size for path in build.rglob("*") if path.is_file())
    shutil.rmtree(build)
    (args.output / "manifest.json").write_text(json.dumps(manifest, indent=2))
    packed, tree = archive.stat().st_size, _tree_bytes()
    mib = 1024 * 1024
    print(
        f"{archive}: {packed / mib:.1f} MiB ({unpacked / mib:.1f} MiB unpacked), built in {time.monotonic() - started:.0f} s"
    )
    print(
        f"the tree: {tree / mib:.1f} MiB; with the pack {(tree + packed) / mib:.1f} MiB of the {LIMIT_MIB} MiB that may travel"
    )
    if tree + packed > LIMIT_MIB * mib:
        raise SystemExit("too large for the device tool")


if __name__ == "__main__":
    main()
