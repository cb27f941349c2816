#!/bin/sh
# Installs core-server and the backend plugins named at build time into the active Python.
#
#   install.sh [--dry-run] SOURCE_DIR EXTRAS PLUGINS
#
# SOURCE_DIR holds core/ and plugins/ (a clone of this repository); EXTRAS are core-server's
# extras, comma-separated ("" for none, "s3", "s3,openai"); PLUGINS names folders of plugins/,
# space-separated, each with its extras if any ("onnx[gpu] python"). --dry-run prints the pip
# commands instead of running them (the tests read them).
set -eu
set -f  # "onnx[gpu]" is a name here, never a glob

dry_run=false
if [ "${1:-}" = "--dry-run" ]; then
    dry_run=true
    shift
fi
if [ "$#" -ne 3 ]; then
    echo "usage: install.sh [--dry-run] SOURCE_DIR EXTRAS PLUGINS" >&2
    exit 2
fi
source_dir=$1
extras=$2
plugins=$3

run() {
    if "$dry_run"; then echo "$*"; else "$@"; fi
}

core="$source_dir/core"
if [ -n "$extras" ]; then
    core="${core}[${extras}]"
fi
targets=$core
onnx_on_gpu=false
for plugin in $plugins; do
    name=${plugin%%\[*}
    if [ ! -f "$source_dir/plugins/$name/pyproject.toml" ]; then
        echo "install.sh: no plugin '$name' in $source_dir/plugins (PLUGINS='$plugins')" >&2
        exit 2
    fi
    if [ "$plugin" = "onnx[gpu]" ]; then
        onnx_on_gpu=true
    fi
    targets="$targets $source_dir/plugins/$plugin"
done

# One resolver run for everything, so pip sees every plugin's requirements at once.
# shellcheck disable=SC2086  # $targets is a list of words on purpose
run python -m pip install --no-cache-dir $targets
if "$onnx_on_gpu"; then
    # plugin-onnx requires onnxruntime, and its gpu extra adds onnxruntime-gpu: the two share
    # one import package, so the CPU build's files go and the GPU build's are laid again.
    # The same version as the resolver chose (a dry run has none to ask for).
    gpu_build=onnxruntime-gpu
    if ! "$dry_run"; then
        gpu_build="onnxruntime-gpu==$(python -c 'from importlib.metadata import version; print(version("onnxruntime-gpu"))')"
    fi
    run python -m pip uninstall --yes onnxruntime
    run python -m pip install --no-cache-dir --no-deps --force-reinstall "$gpu_build"
fi
