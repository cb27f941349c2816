"""Instance names as Triton 2.51 gives them to a model.py (`args['model_instance_name']`):
`<group>_<k>` whatever the count; the group Triton adds when a configuration lists none is
named after the model, groups listed without a name `<model>_<index>`. The expected names are
what the real Triton printed for the same configurations. Where the CUDA driver shows GPUs, the
group Triton adds is KIND_GPU, one instance per GPU, as for Triton's python backend."""

from __future__ import annotations

import re
import time
from pathlib import Path

import tritonclient.http as httpclient

from coreserve.backend.devices import cuda_driver_gpus
from coreserve.testing import ServerFactory

GPUS = cuda_driver_gpus()

MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(
            f"instance-name {args['model_name']} {args['model_instance_name']} {args['model_instance_kind']}"
        )

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""
HEAD = 'backend: "python"\nmax_batch_size: 0\n'
CONFIGS = {
    "listed_none": HEAD,
    "one_unnamed": HEAD + "instance_group [ { count: 1 kind: KIND_CPU } ]",
    "two_groups": HEAD + "instance_group [ { count: 1 kind: KIND_CPU }, { count: 2 kind: KIND_CPU } ]",
    "named_one": HEAD + 'instance_group [ { name: "grp" count: 1 kind: KIND_CPU } ]',
    "named_two": HEAD + 'instance_group [ { name: "pair" count: 2 kind: KIND_CPU } ]',
}
EXPECTED = {
    "listed_none": {f"listed_none_{k}" for k in range(max(1, len(GPUS)))},
    "one_unnamed": {"one_unnamed_0_0"},
    "two_groups": {"two_groups_0_0", "two_groups_1_0", "two_groups_1_1"},
    "named_one": {"grp_0"},
    "named_two": {"pair_0", "pair_1"},
}


def test_instances_are_named_as_triton_names_them(tmp_path: Path, coreserve_server: ServerFactory) -> None:
    for name, config in CONFIGS.items():
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(config)
        (tmp_path / name / "1" / "model.py").write_text(MODEL)
    server = coreserve_server(tmp_path)
    deadline = time.monotonic() + 30
    while server.log.count("instance-name ") < sum(map(len, EXPECTED.values())):
        assert time.monotonic() < deadline, "not every instance logged its name"
        time.sleep(0.1)
    found: dict[str, set[str]] = {}
    for model, instance, kind in re.findall(r"instance-name (\S+) (\S+) ([^\s\"]+)", server.log):
        assert kind == ("GPU" if model == "listed_none" and GPUS else "CPU"), (model, kind)
        found.setdefault(model, set()).add(instance)
    assert found == EXPECTED
    # The configuration the server reports names the groups as Triton's does.
    client = httpclient.InferenceServerClient(server.http_url)
    groups = [client.get_model_config(name)["instance_group"] for name in ("listed_none", "two_groups")]
    client.close()
    assert [[group["name"] for group in listed] for listed in groups] == [
        ["listed_none"],
        ["two_groups_0", "two_groups_1"],
    ]
