"""plugin-fil on real forests: XGBoost, LightGBM and Treelite models trained here, answers
compared with the libraries' own predictions over HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import treelite
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import xgboost
from forest_builders import (
    FEATURES,
    fil_config,
    lightgbm_booster,
    samples,
    write_fil_model,
    xgboost_booster,
)
from tritonclient.utils import InferenceServerException

import coreserve_fil  # noqa: F401  (the plugin under test, installed by README's test command)
from coreserve.testing import ServerProcess

ROWS = samples(64, seed=1)


@pytest.fixture(scope="module")
def boosters() -> dict[str, object]:
    return {
        "xgb_binary": xgboost_booster("binary:logistic"),
        "xgb_multi": xgboost_booster("multi:softprob", classes=3),
        "xgb_softmax": xgboost_booster("multi:softmax", classes=3),
        "xgb_regression": xgboost_booster("reg:squarederror"),
        "lgb_binary": lightgbm_booster("binary"),
        "lgb_multi": lightgbm_booster("multiclass", classes=4),
        "lgb_regression": lightgbm_booster("regression"),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, boosters: dict) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("fil")
    binary, multi = boosters["xgb_binary"], boosters["xgb_multi"]
    json_file = {"xgboost.json": bytes(binary.save_raw("json"))}
    write_fil_model(
        repository,
        "xgb_proba",
        fil_config("xgboost_json", output_class=True, predict_proba=True, width=2),
        json_file,
    )
    write_fil_model(
        repository,
        "xgb_threshold",
        fil_config("xgboost_ubj", output_class=True, width=1, threshold="0.3"),
        {"xgboost.ubj": bytes(binary.save_raw("ubj"))},
    )
    # No inputs or outputs: completed from the model file.
    write_fil_model(
        repository,
        "xgb_multi_auto",
        fil_config("xgboost_json", output_class=True),
        {"xgboost.json": bytes(multi.save_raw("json"))},
    )
    write_fil_model(
        repository,
        "xgb_multi_proba",
        fil_config("xgboost_json", output_class=True, predict_proba=True, width=3),
        {"xgboost.json": bytes(multi.save_raw("json"))},
    )
    write_fil_model(
        repository,
        "xgb_softmax",
        fil_config("xgboost_json", output_class=True, predict_proba=True, width=3),
        {"xgboost.json": bytes(boosters["xgb_softmax"].save_raw("json"))},
    )
    # model_type xgboost (FIL's default) reads xgboost.model; XGBoost 3 writes it as UBJSON.
    write_fil_model(
        repository,
        "xgb_regression",
        fil_config("xgboost", output_class=False, width=1, cpu_nthread="1"),
        {"xgboost.model": bytes(boosters["xgb_regression"].save_raw("ubj"))},
    )
    write_fil_model(
        repository,
        "custom_filename",
        fil_config("xgboost_json", output_class=False, width=1).replace(
            'backend: "fil"', 'backend: "fil"\ndefault_model_filename: "churn.json"'
        ),
        {"churn.json": bytes(boosters["xgb_regression"].save_raw("json"))},
    )
    for name in ("lgb_binary", "lgb_multi", "lgb_regression"):
        booster = boosters[name]
        text = {"model.txt": booster.model_to_string().encode()}
        if name == "lgb_binary":
            write_fil_model(
                repository,
                "lgb_proba",
                fil_config("lightgbm", output_class=True, predict_proba=True, width=2),
                text,
            )
            write_fil_model(repository, "lgb_class", fil_config("lightgbm", output_class=True, width=1), text)
        elif name == "lgb_multi":
            write_fil_model(repository, "lgb_multi", fil_config("lightgbm", output_class=True, width=1), text)
        else:
            write_fil_model(
                repository, "lgb_regression", fil_config("lightgbm", output_class=False, width=1), text
            )
    checkpoint = treelite.frontend.from_xgboost(binary).serialize_bytes()
    write_fil_model(
        repository,
        "treelite",
        fil_config("treelite_checkpoint", output_class=True, predict_proba=True, width=2),
        {"checkpoint.tl": bytes(checkpoint)},
    )
    write_fil_model(
        repository,
        "batched",
        fil_config("xgboost_json", output_class=True, predict_proba=True, width=2)
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\ndynamic_batching { max_queue_delay_microseconds: 300000 }\n",
        json_file,
    )
    # Models that must not load, each for its own reason.
    write_fil_model(repository, "bad_model_type", fil_config("catboost", output_class=True), json_file)
    write_fil_model(
        repository,
        "bad_threshold",
        fil_config("xgboost_json", output_class=True, threshold="high"),
        json_file,
    )
    write_fil_model(
        repository,
        "bad_storage",
        fil_config("xgboost_json", output_class=True, storage_type="COMPACT"),
        json_file,
    )
    write_fil_model(repository, "missing_file", fil_config("lightgbm", output_class=True), json_file)
    write_fil_model(
        repository, "garbage", fil_config("xgboost_json", output_class=True), {"xgboost.json": b"{not json"}
    )
    write_fil_model(
        repository,
        "wrong_width",
        fil_config("xgboost_json", output_class=True, predict_proba=True, width=1),
        json_file,
    )
    write_fil_model(
        repository,
        "pickle_refused",
        fil_config("sklearn", output_class=True),
        {"model.pkl": b"\x80\x04K\x01."},
    )
    write_fil_model(
        repository,
        "gpu_instance",
        fil_config("xgboost_json", output_class=True, width=1)
        + "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]\n",
        json_file,
    )
    process = ServerProcess([repository], ["--exit-on-error=false"]).start(timeout=120)
    yield process
    process.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def _infer(client: httpclient.InferenceServerClient, model: str, rows: np.ndarray = ROWS) -> np.ndarray:
    tensor = httpclient.InferInput("input__0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=True)
    result = client.infer(model, [tensor]).as_numpy("output__0")
    assert result is not None and result.dtype == np.float32
    return result


def _xgb(booster: object, rows: np.ndarray = ROWS, **options: object) -> np.ndarray:
    return np.asarray(booster.predict(xgboost.DMatrix(rows), **options))  # type: ignore[attr-defined]


def test_xgboost_binary_probabilities_are_two_columns(
    client: httpclient.InferenceServerClient, boosters: dict
) -> None:
    expected = _xgb(boosters["xgb_binary"])
    answer = _infer(client, "xgb_proba")
    assert answer.shape == (len(ROWS), 2)
    np.testing.assert_allclose(answer[:, 1], expected, rtol=1e-6)
    np.testing.assert_allclose(answer[:, 0], 1 - expected, rtol=1e-6, atol=1e-7)


def test_xgboost_ubj_binary_class_uses_the_threshold(
    client: httpclient.InferenceServerClient, boosters: dict
) -> None:
    expected = (_xgb(boosters["xgb_binary"]) > 0.3).astype(np.float32)
    assert 0 < expected.sum() < len(expected)
    np.testing.assert_array_equal(_infer(client, "xgb_threshold"), expected.reshape(-1, 1))


def test_xgboost_multiclass_config_is_completed_and_answers_class_ids(
    client: httpclient.InferenceServerClient, boosters: dict
) -> None:
    config = client.get_model_config("xgb_multi_auto")
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("input__0", "TYPE_FP32", [FEATURES])
    ]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("output__0", [1])]
    expected = _xgb(boosters["xgb_multi"]).argmax(axis=1).astype(np.float32)
    assert len(set(expected.tolist())) == 3
    np.testing.assert_array_equal(_infer(client, "xgb_multi_auto"), expected.reshape(-1, 1))


def test_xgboost_multiclass_probabilities(client: httpclient.InferenceServerClient, boosters: dict) -> None:
    np.testing.assert_allclose(
        _infer(client, "xgb_multi_proba"), _xgb(boosters["xgb_multi"]), rtol=1e-5, atol=1e-7
    )


def test_xgboost_softmax_objective_answers_the_probabilities_behind_its_classes(
    client: httpclient.InferenceServerClient, boosters: dict
) -> None:
    booster = boosters["xgb_softmax"]
    answer = _infer(client, "xgb_softmax")
    np.testing.assert_allclose(answer.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(answer.argmax(axis=1), _xgb(booster).astype(int))
    margins = _xgb(booster, output_margin=True)
    expected = np.exp(margins) / np.exp(margins).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-7)


def test_xgboost_legacy_name_and_custom_filename_regress(
    client: httpclient.InferenceServerClient, boosters: dict
) -> None:
    expected = _xgb(boosters["xgb_regression"]).reshape(-1, 1)
    np.testing.assert_allclose(_infer(client, "xgb_regression"), expected, rtol=1e-6)
    np.testing.assert_allclose(_infer(client, "custom_filename"), expected, rtol=1e-6)


def test_lightgbm_binary_multiclass_and_regression(
    client: httpclient.InferenceServerClient, boosters: dict
) -> None:
    probability = boosters["lgb_binary"].predict(ROWS)
    np.testing.assert_allclose(
        _infer(client, "lgb_proba"), np.stack([1 - probability, probability], axis=1), rtol=1e-5
    )
    np.testing.assert_array_equal(_infer(client, "lgb_class").ravel(), (probability > 0.5).astype(np.float32))
    classes = boosters["lgb_multi"].predict(ROWS).argmax(axis=1)
    assert len(set(classes.tolist())) > 2
    np.testing.assert_array_equal(_infer(client, "lgb_multi").ravel(), classes.astype(np.float32))
    np.testing.assert_allclose(
        _infer(client, "lgb_regression").ravel(),
        boosters["lgb_regression"].predict(ROWS),
        rtol=1e-5,
        atol=1e-6,
    )


def test_treelite_checkpoint(client: httpclient.InferenceServerClient, boosters: dict) -> None:
    np.testing.assert_allclose(_infer(client, "treelite")[:, 1], _xgb(boosters["xgb_binary"]), rtol=1e-5)


def test_grpc_answers_as_http(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for model in ("xgb_proba", "lgb_multi", "treelite"):
            tensor = grpcclient.InferInput("input__0", list(ROWS.shape), "FP32")
            tensor.set_data_from_numpy(ROWS)
            answer = grpc.infer(model, [tensor]).as_numpy("output__0")
            np.testing.assert_array_equal(answer, _infer(client, model))
    finally:
        grpc.close()


def test_dynamic_batching_with_two_instances(server: ServerProcess, boosters: dict) -> None:
    def call(index: int) -> np.ndarray:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            return _infer(client, "batched", ROWS[index : index + 1])
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        answers = np.concatenate(list(pool.map(call, range(16))))
    np.testing.assert_allclose(answers[:, 1], _xgb(boosters["xgb_binary"], ROWS[:16]), rtol=1e-6)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics("batched")["model_stats"][0]
    finally:
        client.close()
    assert stats["inference_count"] == 16 and stats["execution_count"] < 16


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (
            "bad_model_type",
            "parameter 'model_type' must be one of xgboost, xgboost_json, xgboost_ubj, lightgbm",
        ),
        ("bad_threshold", "parameter 'threshold' must be a number, got 'high'"),
        (
            "bad_storage",
            "parameter 'storage_type' must be one of AUTO, DENSE, SPARSE, SPARSE8, got 'COMPACT'",
        ),
        (
            "missing_file",
            "model_type 'lightgbm' reads model.txt unless default_model_filename names another file",
        ),
        ("garbage", "XGBoost cannot read"),
        ("wrong_width", "the configuration's shape [-1, 1] does not fit the FIL model's shape [-1, 2]"),
        ("pickle_refused", "set parameter 'allow_pickle' to 'true' only for files you trust"),
        ("gpu_instance", "plugin-fil predicts on the CPU"),
    ],
)
def test_unavailable_models_say_why(
    client: httpclient.InferenceServerClient, model: str, reason: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(model)
    # NOT_FOUND with the reason, as Triton 2.51 answers for a model without a ready version.
    assert info.value.status() == "404" and reason in info.value.message()
    assert client.is_model_ready("xgb_proba")


def test_wrong_feature_count_is_a_client_error(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        _infer(client, "xgb_proba", np.ones((2, FEATURES + 1), np.float32))
    assert info.value.status() == "400"


def test_log_names_each_unavailable_model_once_without_traceback(server: ServerProcess) -> None:
    log = server.log
    assert "Traceback" not in log, log[-4000:]
    errors = [line for line in log.splitlines() if line.startswith("E")]
    for model in ("bad_threshold", "garbage", "gpu_instance", "pickle_refused"):
        lines = [
            line
            for line in errors
            if f"failed to load '{model}'" in line or f"model '{model}' is unavailable" in line
        ]
        assert len(lines) == 1, errors
        assert "model ''" not in lines[0]
