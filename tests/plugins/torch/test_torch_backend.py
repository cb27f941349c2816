"""plugin-torch on real models: TorchScript with Triton's naming, named arguments, dict outputs,
torch.export programs, BF16, batching, and the reasons models are unavailable."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coreserve.backend import InstanceKind, InstancePlacement, ModelFiles, ServerContext
from coreserve.config import parse_config
from coreserve.testing import ServerProcess
from coreserve_torch._loading import create_instance
from torch_models import AddSub, Double, Halves, OnCuda, Weighted

# The CPU build of torch (CI's) sees no GPU; a CUDA build on a machine with an NVIDIA GPU does.
GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(
    not GPU, reason="no CUDA: torch sees no CUDA device (a CUDA build of torch and an NVIDIA GPU)"
)


def _config(
    inputs: list[tuple[str, str]], outputs: list[tuple[str, str]], extra: str = "", max_batch: int = 8
) -> str:
    tensors = lambda items: ", ".join(  # noqa: E731
        f'{{ name: "{name}" data_type: {dtype} dims: [ 4 ] }}' for name, dtype in items
    )
    return (
        f'backend: "pytorch"\nmax_batch_size: {max_batch}\ninput [ {tensors(inputs)} ]\n'
        f"output [ {tensors(outputs)} ]\n{extra}"
    )


def _save_script(folder: Path, module: torch.nn.Module, config: str | None) -> None:
    (folder / "1").mkdir(parents=True)
    with warnings.catch_warnings():  # torch deprecates TorchScript; Triton users still have model.pt files
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(folder / "1" / "model.pt"))
    if config is not None:
        (folder / "config.pbtxt").write_text(config)


FP32 = "TYPE_FP32"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("torch")
    _save_script(
        repository / "indexed",
        AddSub(),
        _config(
            [("INPUT__0", FP32), ("INPUT__1", FP32)],
            [("OUTPUT__0", FP32), ("OUTPUT__1", FP32)],
            "instance_group [ { count: 2 } ]\ndynamic_batching { max_queue_delay_microseconds: 300000 }",
        ),
    )
    _save_script(
        repository / "named",
        Weighted(),
        _config(
            [("y", FP32), ("x", FP32)],
            [("OUT", FP32)],
            'parameters { key: "INFERENCE_MODE" value: { string_value: "false" } }\n'
            'parameters { key: "DISABLE_OPTIMIZED_EXECUTION" value: { string_value: "true" } }',
        ),
    )
    _save_script(
        repository / "dict_out", Halves(), _config([("x", FP32)], [("half", FP32), ("double", FP32)])
    )
    _save_script(repository / "bf16", Double(), _config([("x", "TYPE_BF16")], [("y", "TYPE_BF16")]))
    # Triton's QA L0_output_validation: an output index, and a datatype, the model does not have.
    _save_script(
        repository / "second_only",
        AddSub(),
        _config([("INPUT__0", FP32), ("INPUT__1", FP32)], [("OUTPUT__1", FP32)]),
    )
    _save_script(repository / "no_such_index", Double(), _config([("x", FP32)], [("OUTPUT__1", FP32)]))
    _save_script(repository / "wrong_type", Double(), _config([("x", FP32)], [("y", "TYPE_INT32")]))
    _save_script(
        repository / "on_gpu",
        OnCuda(),
        _config([("x", FP32)], [("y", FP32)], "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]"),
    )
    _save_script(repository / "where", OnCuda(), _config([("x", FP32)], [("y", FP32)]))
    _save_script(
        repository / "wrong_count", AddSub(), _config([("a", FP32), ("b", FP32), ("c", FP32)], [("o", FP32)])
    )
    (repository / "broken" / "1").mkdir(parents=True)
    (repository / "broken" / "1" / "model.pt").write_bytes(b"not a torch file")
    (repository / "broken" / "config.pbtxt").write_text(_config([("x", FP32)], [("y", FP32)]))
    exported = torch.export.export(
        AddSub(),
        (torch.ones(2, 4), torch.ones(2, 4)),
        dynamic_shapes=({0: torch.export.Dim("batch")}, {0: torch.export.Dim("batch")}),
    )
    (repository / "exported" / "1").mkdir(parents=True)
    torch.export.save(exported, str(repository / "exported" / "1" / "model.pt2"))
    (repository / "exported" / "config.pbtxt").write_text(
        'backend: "pytorch"\ndefault_model_filename: "model.pt2"'
    )
    process = ServerProcess([repository], ["--exit-on-error=false"]).start(timeout=180)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def _infer(
    client: httpclient.InferenceServerClient,
    model: str,
    tensors: dict[str, np.ndarray],
    datatype: str = "FP32",
) -> httpclient.InferResult:
    inputs = []
    for name, data in tensors.items():
        tensor = httpclient.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return client.infer(model, inputs)


@pytest.mark.skipif(
    GPU,
    reason="torch sees a CUDA device here: test_with_a_gpu_models_without_instance_group_run_on_it covers it",
)
def test_without_gpus_models_without_instance_group_run_on_the_cpu(
    client: httpclient.InferenceServerClient,
) -> None:
    assert [g["kind"] for g in client.get_model_config("exported")["instance_group"]] == ["KIND_CPU"]
    ones = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(_infer(client, "where", {"x": ones}).as_numpy("y"), 0 * ones)


@needs_gpu
def test_with_a_gpu_models_without_instance_group_run_on_it(client: httpclient.InferenceServerClient) -> None:
    # Triton's default where the backend can use GPUs: one KIND_GPU group over all of them.
    groups = client.get_model_config("where")["instance_group"]
    assert [(g["kind"], g["gpus"]) for g in groups] == [("KIND_GPU", list(range(torch.cuda.device_count())))]
    ones = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(_infer(client, "where", {"x": ones}).as_numpy("y"), ones)


@needs_gpu
def test_a_kind_gpu_instance_runs_its_module_on_that_gpu(client: httpclient.InferenceServerClient) -> None:
    ones = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(_infer(client, "on_gpu", {"x": ones}).as_numpy("y"), ones)


def test_triton_index_naming(client: httpclient.InferenceServerClient) -> None:
    a, b = np.arange(8, dtype=np.float32).reshape(2, 4), np.ones((2, 4), np.float32)
    result = _infer(client, "indexed", {"INPUT__1": b, "INPUT__0": a})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)


def test_an_indexed_output_takes_that_result_whichever_the_configuration_lists(
    client: httpclient.InferenceServerClient,
) -> None:
    a, b = np.arange(8, dtype=np.float32).reshape(2, 4), np.ones((2, 4), np.float32)
    result = _infer(client, "second_only", {"INPUT__0": a, "INPUT__1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "no_such_index",
            "The output OUTPUT__1 in the model configuration refers to an output index which doesn't exist. "
            "This model has 1 outputs",
        ),
        ("wrong_type", "configuration expects datatype TYPE_INT32 for output 'y', model provides TYPE_FP32"),
    ],
)
def test_outputs_the_model_does_not_give_are_refused_in_tritons_words(
    client: httpclient.InferenceServerClient, model: str, message: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        _infer(client, model, {"x": np.ones((1, 4), np.float32)})
    assert info.value.status() == "400" and info.value.message() == message


def test_inputs_matched_by_argument_name(client: httpclient.InferenceServerClient) -> None:
    x, y = np.full((1, 4), 3, np.float32), np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(_infer(client, "named", {"x": x, "y": y}).as_numpy("OUT"), x * 2 + y)


def test_dict_outputs_matched_by_key(client: httpclient.InferenceServerClient) -> None:
    x = np.full((1, 4), 8, np.float32)
    result = _infer(client, "dict_out", {"x": x})
    np.testing.assert_array_equal(result.as_numpy("half"), x / 2)
    np.testing.assert_array_equal(result.as_numpy("double"), x * 2)


def test_bf16(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[1.5, -2.0, 0.25, 3.0]], dtype=ml_dtypes.bfloat16)
    result = _infer(client, "bf16", {"x": x}, datatype="BF16").as_numpy("y")
    assert result.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(result.astype(np.float32), x.astype(np.float32) * 2)


def test_exported_program_with_completed_config(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("exported")
    assert config["max_batch_size"] == 4
    assert [t["name"] for t in config["input"]] == ["a", "b"]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("OUTPUT__0", [4]), ("OUTPUT__1", [4])]
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    result = _infer(client, "exported", {"a": a, "b": a})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), 2 * a)


def test_dynamic_batching_with_two_instances(server: ServerProcess) -> None:
    def call(value: int) -> list[float]:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            a = np.full((1, 4), value, np.float32)
            return (
                _infer(client, "indexed", {"INPUT__0": a, "INPUT__1": a})
                .as_numpy("OUTPUT__0")
                .ravel()
                .tolist()
            )
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(call, range(8))) == [[2.0 * v] * 4 for v in range(8)]
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics("indexed")["model_stats"][0]
    finally:
        client.close()
    assert stats["inference_count"] >= 8 and stats["execution_count"] < stats["inference_count"]


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        # The backend reports the GPUs torch sees: none with the CPU build, so the core refuses.
        pytest.param(
            "on_gpu",
            "specifies invalid or unsupported gpu id 0; the GPUs backend 'pytorch' can use are: none",
            marks=pytest.mark.skipif(GPU, reason="torch sees a CUDA device here: model on_gpu serves"),
        ),
        ("wrong_count", "forward() takes 2 inputs ['a', 'b'], but the configuration lists 3"),
        ("broken", "torch cannot load"),
    ],
)
def test_unavailable_models_say_why(
    client: httpclient.InferenceServerClient, model: str, reason: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(model)
    assert info.value.status() == "404" and reason in info.value.message()


def test_copies_share_the_cores_unless_the_configuration_sets_the_threads(tmp_path: Path) -> None:
    """torch's threads are process-wide: a worker's copy of the model (ServerContext.copies)
    takes its share of the cores, unless INTRA_OP_THREAD_COUNT sets them."""
    _save_script(tmp_path / "doubled", Double(), None)
    files = ModelFiles("doubled", tmp_path / "doubled", 1, "model.pt")
    placement = InstancePlacement(name="doubled_0", group_name="doubled", index=0, kind=InstanceKind.CPU)
    plain = parse_config(_config([("INPUT__0", FP32)], [("OUTPUT__0", FP32)]))
    threads = 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }'
    set_here = parse_config(_config([("INPUT__0", FP32)], [("OUTPUT__0", FP32)], threads))
    cores = len(os.sched_getaffinity(0))
    before = torch.get_num_threads()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load, in this process
            torch.set_num_threads(cores)
            for config, copies, threads in (
                (plain, 1, cores),
                (plain, 2, max(1, cores // 2)),
                (set_here, 2, 1),
            ):
                instance = create_instance(files, config, placement, ServerContext(copies=copies))
                asyncio.run(instance.close())
                assert torch.get_num_threads() == threads, (copies, threads)
    finally:
        torch.set_num_threads(before)
