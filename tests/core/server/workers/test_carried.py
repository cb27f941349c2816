"""What the supervisor carries of workers that died (`coreserve.server.workers._carried`):
each worker's last figures, carried once per life that ended, forgotten for a model loaded
again, and added by the merges only to what the living workers serve."""

from __future__ import annotations

from typing import Any

from coreserve.server.workers._carried import ALL_STATISTICS, METRICS, CarriedFigures
from coreserve.server.workers._merge import merge_metrics, merge_statistics

COUNTER = "# TYPE nv_inference_request_success counter\n"


def _metrics(**counts: int) -> str:
    return COUNTER + "".join(
        f'nv_inference_request_success{{model="{m}",version="1"}} {n}\n' for m, n in counts.items()
    )


def _statistics(**counts: int) -> dict[str, Any]:
    return {"model_stats": [{"name": m, "version": "1", "inference_count": n} for m, n in counts.items()]}


def test_each_life_is_carried_once_as_last_seen() -> None:
    carried = CarriedFigures()
    carried.seen(1, METRICS, _metrics(add=3))
    carried.seen(1, METRICS, _metrics(add=5))  # the latest counts
    carried.seen(1, ALL_STATISTICS, _statistics(add=5, other=1))
    # A later read of one model takes its place among the last statistics of every model.
    carried.seen(1, {"call": "statistics", "name": "add", "version": ""}, _statistics(add=6))
    version_2 = {"model_stats": [{"name": "other", "version": "2", "inference_count": 50}]}
    carried.seen(1, {"call": "statistics", "name": "other", "version": "2"}, version_2)  # v1 kept
    carried.died(1)
    carried.died(1)  # nothing seen of the next life yet: nothing more to carry
    live = _metrics(add=2)
    assert 'nv_inference_request_success{model="add",version="1"} 7' in merge_metrics(
        [live], carried=carried.for_gather(METRICS)
    )
    stats = merge_statistics(
        [_statistics(add=2, other=1)], carried.for_gather({"call": "statistics", "name": "add"})
    )
    assert {model["name"]: model["inference_count"] for model in stats["model_stats"]} == {
        "add": 8,
        "other": 2,
    }
    carried.seen(1, METRICS, _metrics(add=4))  # the second life
    carried.died(1)
    (text,) = carried.for_gather(METRICS)
    assert 'nv_inference_request_success{model="add",version="1"} 9' in text  # 5 + 4, in one text


def test_a_model_loaded_again_is_forgotten_in_the_carried_and_the_last_seen() -> None:
    carried = CarriedFigures()
    carried.seen(0, METRICS, _metrics(add=5, other=1))
    carried.died(0)
    carried.seen(0, METRICS, _metrics(add=2, other=1))
    carried.forget_model("add")
    carried.died(0)
    (text,) = carried.for_gather(METRICS)
    assert 'model="add"' not in text and 'nv_inference_request_success{model="other",version="1"} 2' in text
    assert carried.for_gather({"call": "peers_ready"}) == []
