"""The model repositories the run serves: the networks through plugin-torch (dynamic batching,
and a twin with the CUDA-graphs parameter), the same ResNet-50 as a Triton model.py running
torch on GPU tensors through DLPack, and the add-one model.py of the CPU comparison."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.gpu._plan import Plan
from benchmarks.python.python_speed import CONFIG as ADD_ONE_CONFIG
from benchmarks.python.python_speed import MODEL as ADD_ONE
from benchmarks.python.python_speed import MODEL_PY as ADD_ONE_PY

RESNET, RESNET_GRAPHS, BERT, RESNET_PY = "resnet50", "resnet50_graphs", "bert", "resnet50_py"

# Runs unchanged in coreserve's plugin-python and Triton's python backend: the requests of one
# execute() are one batch on the instance's device; outputs stay there, handed over by DLPack.
MODEL_PY = """
import os

import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if args["model_instance_kind"] == "GPU":
            self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        else:
            self.device = torch.device("cpu")
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.module = torch.jit.load(os.path.join(folder, "model.pt"), map_location=self.device)

    def execute(self, requests):
        inputs = [
            torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT__0").to_dlpack())
            for request in requests
        ]
        sizes = [len(tensor) for tensor in inputs]
        with torch.inference_mode():
            batch = torch.cat(inputs).to(self.device, non_blocking=True)
            outputs = self.module(batch).split(sizes)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor.from_dlpack("OUTPUT__0", torch.utils.dlpack.to_dlpack(output.contiguous()))]
            )
            for output in outputs
        ]
"""


def classes(plan: Plan) -> int:
    return 10 if plan.resnet == "tiny" else 1000


def _config(plan: Plan, backend: str, input_type: str, input_dims: list[int], output_dims: list[int],
            count: int = 1, parameters: dict[str, str] | None = None) -> str:  # fmt: skip
    dims = ", ".join(map(str, input_dims))
    text = f"""
backend: "{backend}"
max_batch_size: {plan.max_batch}
input [ {{ name: "INPUT__0" data_type: {input_type} dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: {plan.config_dtype} dims: [ {", ".join(map(str, output_dims))} ] }} ]
instance_group [ {{ count: {count} kind: {plan.kind} }} ]
dynamic_batching {{ max_queue_delay_microseconds: {plan.queue_delay_us} }}
"""
    for key, value in (parameters or {}).items():
        text += f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    return text


def _model(repository: Path, name: str, config: str, files: dict[str, Path | str]) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (repository / name / "config.pbtxt").write_text(config)
    for file_name, source in files.items():
        if isinstance(source, Path):
            shutil.copyfile(source, version / file_name)
        else:
            (version / file_name).write_text(source)


def resnet_py(plan: Plan, repository: Path, networks: dict[str, dict[str, str]]) -> Path:
    """The model.py ResNet-50, alone in `repository` (what the real Triton serves too)."""
    image = list(plan.image)
    config = _config(plan, "python", plan.config_dtype, image, [classes(plan)], count=plan.python_instances)
    _model(
        repository, RESNET_PY, config, {"model.py": MODEL_PY, "model.pt": Path(networks["resnet50"]["path"])}
    )
    return repository


def gpu_repository(plan: Plan, repository: Path, networks: dict[str, dict[str, str]]) -> Path:
    """coreserve's repository: plugin-torch's ResNet-50, its CUDA-graphs twin and BERT, and the
    model.py ResNet-50."""
    image, resnet = list(plan.image), Path(networks["resnet50"]["path"])
    torch_config = _config(plan, "pytorch", plan.config_dtype, image, [classes(plan)])
    _model(repository, RESNET, torch_config, {"model.pt": resnet})
    # On the CPU (the dry run) the parameter refuses the load: the twin runs without it there.
    on = {plan.cuda_graphs_parameter: "true"} if plan.device == "cuda" else {}
    graphs = _config(plan, "pytorch", plan.config_dtype, image, [classes(plan)], parameters=on)
    _model(repository, RESNET_GRAPHS, graphs, {"model.pt": resnet})
    bert = _config(plan, "pytorch", "TYPE_INT64", [plan.bert_sequence], [plan.bert_hidden])
    _model(repository, BERT, bert, {"model.pt": Path(networks["bert"]["path"])})
    return resnet_py(plan, repository, networks)


def add_one_repository(repository: Path, instances: int) -> Path:
    """python_speed.py's add-one model.py with `instances` CPU instances."""
    config = ADD_ONE_CONFIG.replace("count: 1", f"count: {instances}")
    _model(repository, ADD_ONE, config, {"model.py": ADD_ONE_PY})
    return repository
