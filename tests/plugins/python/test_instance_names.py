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


OVERLAPPING = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(f"initialize-begins {args['model_instance_name']}")
        time.sleep(1.5)
        pb_utils.Logger.log_info(f"initialize-ends {args['model_instance_name']}")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""


def test_the_instances_of_a_model_start_at_the_same_time_as_on_triton(
    tmp_path: Path, coreserve_server: ServerFactory
) -> None:
    """Each initialize() begins before the other ends (one after the other, they never overlap)."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(HEAD + "instance_group [ { count: 2 kind: KIND_CPU } ]")
    (tmp_path / "slow" / "1" / "model.py").write_text(OVERLAPPING)
    server = coreserve_server(tmp_path)
    steps = re.findall(r"initialize-(begins|ends) (slow_0_[01])", server.log)
    assert sorted(steps) == [
        ("begins", "slow_0_0"),
        ("begins", "slow_0_1"),
        ("ends", "slow_0_0"),
        ("ends", "slow_0_1"),
    ]
    assert [step for step, _ in steps[:2]] == ["begins", "begins"]
