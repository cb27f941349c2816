"""The FIL backend keeps the backend contract (coreserve.testing's conformance suite)."""

from __future__ import annotations

from pathlib import Path

import pytest
from forest_builders import fil_config, lightgbm_booster, write_fil_model, xgboost_booster

import coreserve_fil  # noqa: F401  (the plugin under test, installed by README's test command)
from coreserve.testing import BackendConformance


class TestFilBackendConformance(BackendConformance):
    model_names = ("xgb_proba", "xgb_multi_auto", "lgb_regression")

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_repository(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp("fil-conformance")
        binary = xgboost_booster("binary:logistic")
        multi = xgboost_booster("multi:softprob", classes=3)
        write_fil_model(
            root,
            "xgb_proba",
            fil_config("xgboost_json", output_class=True, predict_proba=True, width=2),
            {"xgboost.json": bytes(binary.save_raw("json"))},
        )
        # No inputs or outputs: completed from the model file.
        write_fil_model(
            root,
            "xgb_multi_auto",
            fil_config("xgboost_json", output_class=True),
            {"xgboost.json": bytes(multi.save_raw("json"))},
        )
        text = lightgbm_booster("regression").model_to_string().encode()
        write_fil_model(
            root, "lgb_regression", fil_config("lightgbm", output_class=False, width=1), {"model.txt": text}
        )
        return root
