#!/usr/bin/env bash
# The device run of benchmarks/gpu (issue 48), whole: unpacks .gpu-carry/gpu-pack.tar.xz (made
# here by `python -m benchmarks.gpu.pack`), puts the tree's code and the pack's packages on
# PYTHONPATH, says what the machine has, then runs the benchmark within its budget. The device
# call, with carry [".gpu-carry"] and timeout_s 600:
#
#   PYTHONUNBUFFERED=1 bash benchmarks/gpu/device-run.sh
#
# Writes $OUT/gpu-h200.json (rewritten after every stage), $OUT/log and $OUT/manifest.json.
# Arguments go to `python -m benchmarks.gpu` (--dry-run runs it here, on the CPU, from the pack).
# `--module M ARGS...` runs another benchmark instead, `python -m M ARGS...` (e.g.
# benchmarks.features.shadow_cost --load-generator perf_analyzer), and copies the results files
# it writes into $OUT. `--gpu-tests ARGS...` runs .ci/gpu-tests ARGS... (the pack carries what its
# tests need that the device lacks) and writes $OUT/gpu-tests.xml (JUnit); it stops them at 540 s,
# and each test at 120 s, so that the file is written within the device tool's 600 s.
# GPU_BUDGET_S (default 420) is the benchmark's budget; with unpacking, imports and the servers'
# starts and stops the whole stays within 8 minutes (a hard stop at 470 s keeps what was written;
# another benchmark of --module stops there too).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
module=benchmarks.gpu
if [[ ${1:-} == --module ]]; then module=$2; shift 2; fi
if [[ ${1:-} == --gpu-tests ]]; then module=gpu-tests; shift; fi
out=${OUT:-/tmp/gpu-bench-out}
mkdir -p "$out"
pack=${GPU_PACK_DIR:-/tmp/gpu-pack}
started=$SECONDS
rm -rf "$pack"
if ! { mkdir -p "$pack" && tar -xJf .gpu-carry/gpu-pack.tar.xz -C "$pack"; }; then
  echo "no pack: run python -m benchmarks.gpu.pack here and carry .gpu-carry" >&2
  exit 1
fi
cp "$pack/manifest.json" "$out/manifest.json"
python=${PYTHON:-python3}
pack_python=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["python"])' "$pack/manifest.json")
here_python=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
export PYTHONPATH=$PWD/core:$PWD/plugins/torch:$PWD/plugins/python:$PWD/plugins/onnx:$PWD/plugins/tensorrt:$PWD
# The pack's packages are built for the device's Python: elsewhere (the dry run here) its own serve.
[[ $pack_python == "$here_python" ]] && PYTHONPATH=$PYTHONPATH:$pack/site
export GPU_TRITON_ROOT=$pack/triton PERF_ANALYZER=$pack/perf_analyzer/perf_analyzer
GPU_BENCH_COMMIT=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["commit"])' "$pack/manifest.json")
export GPU_BENCH_COMMIT
command -v nvidia-smi >/dev/null && export BENCHMARK_MACHINE=${BENCHMARK_MACHINE:-the nvidia-h200 device machine; servers and load generators on its CPUs}
# Triton's stub links against this Python's shared library: say where it is (or that it is not).
libpython=libpython$here_python.so.1.0
for folder in "$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')" \
    /usr/lib/x86_64-linux-gnu /usr/local/lib /usr/lib; do
  [[ -e $folder/$libpython ]] && { export GPU_LIBPYTHON_DIR=$folder; break; }
done
{
  echo "pack: $(cat "$pack/manifest.json" | tr -d '\n ')"
  echo "unpacked in $((SECONDS - started)) s; $libpython in ${GPU_LIBPYTHON_DIR:-(not found: the real Triton cannot start)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu --format=csv 2>&1
  "$python" -c 'import coreserve, coreserve_torch, coreserve_python, tritonclient.grpc, google.protobuf, numpy, torch
print("coreserve", coreserve.__file__, "protobuf", google.protobuf.__version__, "numpy", numpy.__version__,
      "torch", torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1
  "$PERF_ANALYZER" --version 2>&1 | head -1
} 2>&1 | tee -a "$out/log"
if [[ $module == benchmarks.gpu ]]; then
  timeout -k 5 470 "$python" -m benchmarks.gpu --budget-s "${GPU_BUDGET_S:-420}" --output "$out/gpu-h200.json" "$@" 2>&1 \
    | tee -a "$out/log"
  status=${PIPESTATUS[0]}
elif [[ $module == gpu-tests ]]; then
  timeout -k 5 540 env PYTHON="$python" bash .ci/gpu-tests -o timeout=120 --junitxml="$out/gpu-tests.xml" "$@" 2>&1 \
    | tee -a "$out/log"
  status=${PIPESTATUS[0]}
else
  timeout -k 5 470 "$python" -m "$module" "$@" 2>&1 | tee -a "$out/log"
  status=${PIPESTATUS[0]}
  find benchmarks/results -name '*.json' -newer "$out/manifest.json" -exec cp {} "$out/" \;
fi
echo "device-run: exit $status after $((SECONDS - started)) s" | tee -a "$out/log"
exit "$status"
