"""plugin-fil's opt-in for pickled scikit-learn forests: served with `allow_pickle`, refused without it."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from forest_builders import fil_config, labels, samples, write_fil_model
from sklearn import ensemble

import coreserve_fil  # noqa: F401  (the plugin under test, installed by README's test command)
from coreserve.testing import ServerProcess

ROWS = np.nan_to_num(samples(32, seed=2))


@pytest.fixture(scope="module")
def estimators() -> dict[str, object]:
    data = np.nan_to_num(samples(300))
    binary = ensemble.RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0).fit(
        data, labels(data, 2)
    )
    multi = ensemble.RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0).fit(
        data, labels(data, 3)
    )
    regressor = ensemble.RandomForestRegressor(n_estimators=10, max_depth=4, random_state=0).fit(
        data, labels(data, 0)
    )
    return {"binary": binary, "multi": multi, "regressor": regressor}


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, estimators: dict
) -> Iterator[httpclient.InferenceServerClient]:
    repository = tmp_path_factory.mktemp("fil-sklearn")
    trusted = {"allow_pickle": "true"}
    shapes = {"binary": (True, 2), "multi": (True, 3), "regressor": (False, 1)}
    for name, estimator in estimators.items():
        output_class, width = shapes[name]
        config = fil_config(
            "sklearn", output_class=output_class, predict_proba=output_class, width=width, **trusted
        )
        write_fil_model(repository, name, config, {"model.pkl": pickle.dumps(estimator)})
    write_fil_model(
        repository,
        "multi_class_ids",
        fil_config("sklearn", output_class=True, width=1, **trusted),
        {"model.pkl": pickle.dumps(estimators["multi"])},
    )
    process = ServerProcess([repository]).start(timeout=120)
    client = httpclient.InferenceServerClient(process.http_url)
    yield client
    client.close()
    process.close()


def _infer(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    tensor = httpclient.InferInput("input__0", list(ROWS.shape), "FP32")
    tensor.set_data_from_numpy(ROWS)
    return client.infer(model, [tensor]).as_numpy("output__0")


def test_pickled_classifiers_answer_their_probabilities(
    client: httpclient.InferenceServerClient, estimators: dict
) -> None:
    for name in ("binary", "multi"):
        np.testing.assert_allclose(
            _infer(client, name), estimators[name].predict_proba(ROWS), rtol=1e-6, atol=1e-7
        )
    expected = estimators["multi"].predict(ROWS).astype(np.float32)
    np.testing.assert_array_equal(_infer(client, "multi_class_ids").ravel(), expected)


def test_pickled_regressor(client: httpclient.InferenceServerClient, estimators: dict) -> None:
    np.testing.assert_allclose(
        _infer(client, "regressor").ravel(), estimators["regressor"].predict(ROWS), rtol=1e-6
    )
