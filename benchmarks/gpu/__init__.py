"""coreserve on a GPU (issue 48): one prepared run of at most 8 minutes on an H200 machine, and
its CPU dry run that CI keeps from rotting.

    python -m benchmarks.gpu [--dry-run] [--output PATH] [--budget-s 480] [--stages ...]

Stages, in this order, each with its share of --budget-s and its own error (the others go on),
each writing its figures into the results file as soon as it has them:

- networks: ResNet-50 (torchvision) and a BERT-base encoder (transformers, sequence 128) built
  on the device with random weights of seed 0, FP16, saved as TorchScript; each timed at batch
  1 in this process. The dry run: a tiny conv net and a tiny BERT (hidden 32, 2 layers,
  sequence 8; a torch.nn.TransformerEncoder where transformers is missing), FP32 on the CPU.
- plugin_torch: both served by plugin-torch (one KIND_GPU instance, dynamic batching), driven
  by perf_analyzer over gRPC from concurrency 1 to 256; ResNet-50 over HTTP binary and CUDA
  shared memory (system shared memory in the dry run) too, at the shared-memory target's
  concurrency (16) only. Against the framework's limit: the
  same file in this process at the batch sizes the batcher formed (the model's batch_stats).
- cuda_graphs: the twin of ResNet-50 whose configuration sets --cuda-graphs-parameter, on and
  off at concurrency 1 and saturation. The twin captures its graphs (every batch size up to
  128) while the server starts, in plugin_torch's time; the server's line saying how long that
  took is recorded.
- two_models: ResNet-50 and BERT driven at once, each against its figure alone.
- gpu_memory: nv_gpu_memory_used_bytes and nv_gpu_utilization of coreserve's /metrics against
  NVML's readings, sampled every 0.5 s during the stages above (the dry run: CPU memory).
- python_backend: the same ResNet-50 as a Triton model.py (torch on the GPU, tensors through
  DLPack), in coreserve's python backend and in the real Triton 2.51, the same instances.
- cpu_workers: python_speed.py's add-one model.py, HTTP JSON and gRPC at concurrency 128:
  coreserve with one worker per core against the real Triton with as many instances.
- targets: each target beside its figure.

The real Triton comes from $GPU_TRITON_ROOT (the pack's copy) or the install of
shared/tools/real-tritonserver; where neither is there, its stages fail and say so. perf_analyzer
comes from $PERF_ANALYZER or PATH.

On the device: `python -m benchmarks.gpu.pack` here first (it builds .gpu-carry/, ignored, and
prints its size), then one call of the device tool, carry [".gpu-carry"], timeout_s 600:

    PYTHONUNBUFFERED=1 bash benchmarks/gpu/device-run.sh

device-run.sh unpacks the pack into $GPU_PACK_DIR (default /tmp/gpu-pack), puts the tree's code
and the pack's packages ($GPU_PACK_DIR/site, where the pack was built for the device's Python) on
PYTHONPATH, runs the benchmark with --budget-s $GPU_BUDGET_S (default 420; 480 is the default only
of a direct `python -m benchmarks.gpu`) under a hard stop at 470 s, and writes
$OUT/gpu-h200.json, $OUT/log and $OUT/manifest.json; copy the JSON to
benchmarks/results/gpu-h200.json and commit it.
"""
