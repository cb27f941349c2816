"""Where instance groups run, from the GPUs a backend reports (coreserve.config.instance_groups)."""

from __future__ import annotations

import pytest

from coreserve.config import apply_defaults, parse_config
from coreserve.errors import ModelConfigError
from coreserve.protos.model_config_pb2 import ModelInstanceGroup

CPU, GPU = ModelInstanceGroup.KIND_CPU, ModelInstanceGroup.KIND_GPU


def _groups(text: str, gpus: tuple[int, ...] | None) -> list[tuple[int, list[int], int]]:
    config = parse_config('backend: "b"\n' + text)
    apply_defaults(config, "m", gpus)
    return [(group.kind, list(group.gpus), group.count) for group in config.instance_group]


@pytest.mark.parametrize(
    ("text", "gpus", "placed"),
    [
        # No instance_group, or KIND_AUTO: every reported GPU, else the CPU.
        ("", (0, 1), [(GPU, [0, 1], 1)]),
        ("", (), [(CPU, [], 1)]),
        ("instance_group [ { kind: KIND_AUTO count: 2 } ]", (1,), [(GPU, [1], 2)]),
        ("instance_group [ { kind: KIND_AUTO count: 2 } ]", (), [(CPU, [], 2)]),
        ("instance_group [ { kind: KIND_AUTO gpus: [ 1 ] } ]", (0, 1), [(GPU, [1], 1)]),
        # KIND_GPU without gpus: count instances on each reported GPU.
        ("instance_group [ { kind: KIND_GPU count: 2 } ]", (0, 1, 2), [(GPU, [0, 1, 2], 2)]),
        ("instance_group [ { kind: KIND_GPU gpus: [ 2 ] } ]", (0, 1, 2), [(GPU, [2], 1)]),
        ("instance_group [ { kind: KIND_CPU count: 3 } ]", (0, 1), [(CPU, [], 3)]),
        ("instance_group [ { kind: KIND_CPU count: -1 } ]", (0, 1), [(CPU, [], 1)]),  # below 1: one
        # A backend that does not report keeps the placement it always had.
        ("", None, [(CPU, [], 1)]),
        ("instance_group [ { kind: KIND_GPU } ]", None, [(GPU, [], 1)]),
        ("instance_group [ { gpus: [ 3 ] } ]", None, [(GPU, [3], 1)]),
    ],
)
def test_groups_are_placed_as_triton_places_them(
    text: str, gpus: tuple[int, ...] | None, placed: list[tuple[int, list[int], int]]
) -> None:
    assert _groups(text, gpus) == placed


@pytest.mark.parametrize(
    ("text", "gpus", "counts"),
    [
        # Triton's SetDefaultInstanceCount: a CPU group without a count has the backend's
        # default CPU count (2 for onnxruntime and tensorflow), a GPU group one per GPU.
        ("", (), [2]),
        ("", None, [2]),
        ("", (0, 1), [1]),
        ("instance_group [ { kind: KIND_CPU } ]", (0,), [2]),
        ("instance_group [ { kind: KIND_CPU count: 0 } ]", (), [2]),  # below 1 is no count
        ("instance_group [ { kind: KIND_CPU count: 1 } ]", (), [1]),  # a count given stays
        ("instance_group [ { kind: KIND_GPU }, { kind: KIND_AUTO } ]", (0,), [1, 1]),
    ],
)
def test_a_cpu_group_without_a_count_has_the_backends_default_count(
    text: str, gpus: tuple[int, ...] | None, counts: list[int]
) -> None:
    config = parse_config('backend: "b"\n' + text)
    apply_defaults(config, "m", gpus, cpu_instances=2)
    assert [group.count for group in config.instance_group] == counts


@pytest.mark.parametrize(
    ("text", "gpus", "reason"),
    [
        (
            "instance_group [ { kind: KIND_GPU } ]",
            (),
            "instance group m_0 of model m has kind KIND_GPU but no GPUs are available "
            "(backend 'b' reports no GPU it can use; use KIND_CPU or KIND_AUTO)",
        ),
        (
            "instance_group [ { kind: KIND_GPU gpus: [ 0, 3 ] } ]",
            (0, 1),
            "instance group m_0 of model m specifies invalid or unsupported gpu id 3; "
            "the GPUs backend 'b' can use are: 0, 1",
        ),
        (
            "instance_group [ { gpus: [ 0 ] } ]",
            (),
            "instance group m_0 of model m specifies invalid or unsupported gpu id 0; "
            "the GPUs backend 'b' can use are: none",
        ),
    ],
)
def test_gpu_groups_the_backend_cannot_serve_say_why(text: str, gpus: tuple[int, ...], reason: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        _groups(text, gpus)
    assert info.value.message == reason


@pytest.mark.parametrize("count", [0, -2, 1.5, "2", True])
def test_a_backends_default_cpu_instance_count_that_is_no_count_fails_the_load(count: object) -> None:
    config = parse_config('backend: "b"')
    with pytest.raises(ModelConfigError) as info:
        apply_defaults(config, "m", (), cpu_instances=count)  # type: ignore[arg-type]
    assert info.value.message == (
        f"model 'm': backend 'b' has default_cpu_instance_count {count!r}: a whole number of at least 1"
    )
