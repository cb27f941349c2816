"""The totals of all workers: one server's statistics and metrics from each worker's own.

Every worker process is a whole server with its own model replicas, so each counts only the
requests it served. The supervisor asks every worker for its statistics (the shape
`DataPlane.statistics()` returns) and its /metrics text, and answers with these merges: a
client sees one server, whose counts are those of all its workers. Pure functions, no I/O.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# Statistics -------------------------------------------------------------------------------


def merge_statistics(answers: list[dict[str, Any]], carried: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The statistics of all workers as one server's, in the shape of each answer.

    :param answers: each worker's `{"model_stats": [...]}`, as `DataPlane.statistics()` gives it.
    :param carried: the last statistics of workers' earlier lives (a worker that died and was
        started again): their counts are added to the models the answers have (a model they
        lack is not served any more), so that the server's counts do not fall back when a
        worker starts again; their memory is not (it went with them).
    :return: one `{"model_stats": [...]}`: the models in the order the first answer lists them,
        then those only later answers list (a worker that restarted, or loaded a model the
        others have not yet), each once. Per model: every count and `ns` summed, over
        `inference_stats`, `response_stats` (by key) and `batch_stats` (by `batch_size`,
        ascending as the server sorts them); `last_inference` the latest; `memory_usage`
        summed by device (`type`, `id`); name, version and other text as the first answer
        writes them. A field only some answers have is kept. Integers stay integers.

    Models are matched by name and version and, where namespacing lets two models share a
    name, by their place among the entries of that name: every worker serves the same
    repository, listed in the same order.
    """
    merged: dict[tuple[str, str, int], dict[str, Any]] = {}
    for answer in answers:
        for key, model in _keyed(answer):
            total = merged.get(key)
            merged[key] = copy.deepcopy(model) if total is None else _add(total, model, _MODEL_FIELDS)
    for answer in carried:
        for key, model in _keyed(answer):
            if key in merged:
                past = {field: value for field, value in model.items() if field != "memory_usage"}
                merged[key] = _add(merged[key], past, _MODEL_FIELDS)
    return {"model_stats": list(merged.values())}


def _keyed(answer: dict[str, Any]) -> Iterator[tuple[tuple[str, str, int], dict[str, Any]]]:
    seen: dict[tuple[str, str], int] = {}
    for model in answer.get("model_stats", ()):
        name_version = (model["name"], model["version"])
        place = seen[name_version] = seen.get(name_version, -1) + 1
        yield (*name_version, place), model


def without_model_statistics(answer: dict[str, Any], name: str) -> dict[str, Any]:
    """`answer` without the entries of model `name` (loaded again: its counts start anew)."""
    return {
        **answer,
        "model_stats": [model for model in answer.get("model_stats", ()) if model["name"] != name],
    }


def with_model_statistics(
    answer: dict[str, Any], model_answer: dict[str, Any], name: str, version: str
) -> dict[str, Any]:
    """`answer` (every model's statistics) with the entries of model `name` (of its `version`
    only, unless "") replaced by those of `model_answer`, a newer answer for it."""
    kept = [
        model
        for model in answer.get("model_stats", ())
        if model["name"] != name or (version and model["version"] != version)
    ]
    return {**answer, "model_stats": kept + list(model_answer.get("model_stats", ()))}


def _add(total: Any, more: Any, fields: dict[str, Callable[[Any, Any], Any]] | None = None) -> Any:
    """`more` added to `total`: integers summed, mappings merged key by key (`fields` names a
    key's own rule), anything else (text) as `total` has it."""
    if isinstance(total, dict) and isinstance(more, dict):
        merged = dict(total)
        for key, value in more.items():
            if key not in merged:
                merged[key] = copy.deepcopy(value)
            else:
                rule = (fields or {}).get(key)
                merged[key] = rule(merged[key], value) if rule else _add(merged[key], value)
        return merged
    if _is_count(total) and _is_count(more):
        return total + more
    return total


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rows_by(keys: tuple[str, ...], *, ascending: bool) -> Callable[[list[Any], list[Any]], list[Any]]:
    """A rule for a list of rows: rows with the same `keys` added (the keys kept, not summed)."""

    def row_key(key: tuple[Any, ...]) -> dict[str, Any]:
        return dict(zip(keys, key, strict=True))

    def merge(total: list[Any], more: list[Any]) -> list[Any]:
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in (*total, *more):
            key = tuple(row[name] for name in keys)
            before = rows.get(key)
            # the keys as they are: two rows of batch size 2 make one of batch size 2, not 4
            rows[key] = copy.deepcopy(row) if before is None else {**_add(before, row), **row_key(key)}
        merged = list(rows.values())
        return sorted(merged, key=lambda row: tuple(row[name] for name in keys)) if ascending else merged

    return merge


_MODEL_FIELDS: dict[str, Callable[[Any, Any], Any]] = {
    "last_inference": max,  # milliseconds since the epoch: the server's last is the latest
    "batch_stats": _rows_by(("batch_size",), ascending=True),
    # Summed: each worker holds its own copy of the model, so the server as a whole holds the
    # sum on that device. One copy's size would understate what the server takes, and the
    # metrics' per-model memory gauges are summed the same way.
    "memory_usage": _rows_by(("type", "id"), ascending=False),
}


# Metrics ----------------------------------------------------------------------------------

# Families every worker reads alike, because they describe the machine or the kind of process
# rather than what one worker did: one worker's reading is the server's, and a sum would count
# the machine once per worker. nv_energy_consumption is a counter, but of the GPU's joules,
# the same in every worker.
TAKEN_ONCE = frozenset(
    {
        "coreserve_traffic_weight",  # every worker applies the same policy
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
        # prometheus-client's: a limit and a start time each process has, and the interpreter.
        "process_max_fds",
        "process_start_time_seconds",
        "python_info",
    }
)
# Gauges whose sum means nothing. The workers load their models at the same time, so the
# server took as long as the slowest worker.
LARGEST = frozenset({"nv_model_load_duration_secs", "coreserve_traffic_shadow_output_max_abs_diff"})
# A fraction of each worker's cache, all of one size (the same --cache-config): the mean is
# the fraction of all of them; with one shared store (Redis) every worker reads the same.
AVERAGED = frozenset({"nv_cache_util"})
# What a shared store (Redis) reports for the whole store, each worker alike.
SHARED_CACHE = frozenset({"nv_cache_num_entries"})

_SUFFIXES = ("", "_bucket", "_sum", "_count", "_total", "_created")
_INTEGER = re.compile(r"[+-]?\d+")


class _Family:
    """One family across the texts: its HELP and TYPE lines and each sample's values."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.help: str | None = None
        self.type: str | None = None
        self.kind = "untyped"
        # (sample name, labels as written) -> the value as each text that has it writes it.
        self.samples: dict[tuple[str, str], list[str]] = {}


def merge_metrics(texts: list[str], *, shared_cache: bool = False, carried: Sequence[str] = ()) -> str:
    """The /metrics texts of all workers as one server's, in Prometheus text format 0.0.4.

    :param texts: each worker's scrape, as coreserve's /metrics writes it.
    :param shared_cache: the response cache is one store all workers share (Redis), so its
        entry count is the store's, the same in every text.
    :param carried: the last texts of workers' earlier lives (a worker that died and was
        started again): their counters, histograms and summaries' `_sum` and `_count` are added
        to the samples the texts have (a sample they lack is not served any more), so that a
        counter of the server never falls back; their gauges are not (they went with them).
    :return: one text: each family once, with its HELP and TYPE lines from the first text that
        has them, the families in the order they are first seen, and in each family its
        samples (matched by name and labels, as written) in the order they are first seen.
        A sample's value is
        - for the families of `TAKEN_ONCE` (the machine's CPUs, GPUs and memory, the process
          kind) and, with `shared_cache`, of `SHARED_CACHE`: the first text's, as written;
        - for `LARGEST` (model load time): the largest;
        - for `AVERAGED` (cache utilization): the mean;
        - for a summary's quantiles (`{quantile="…"}`): the largest, NaN where no text has a
          number. Quantiles of the workers' separate windows cannot be merged exactly: the
          largest is an upper bound of the server's quantile, the side a latency alarm wants;
        - for everything else, counters, histograms' buckets, `_sum` and `_count`, summaries'
          `_sum` and `_count`, and gauges (pending requests, model memory, a backend's own):
          the sum, since each worker counts and holds only its own.
        Numbers keep the server's style: a sum of integers is written as an integer, other
        sums as Python writes a float (exact), NaN and infinities as Prometheus does; values
        taken from one text keep their text. Timestamps on samples are dropped (coreserve
        writes none).
    """
    families: dict[str, _Family] = {}
    for text in texts:
        current: _Family | None = None
        for line in text.splitlines():
            if line.startswith("#"):
                words = line.split(None, 3)
                if len(words) >= 3 and words[1] in ("HELP", "TYPE"):
                    family = families.setdefault(words[2], _Family(words[2]))
                    if words[1] == "HELP":
                        family.help = family.help or line
                    else:
                        family.type = family.type or line
                        family.kind = words[3].strip() if len(words) > 3 else "untyped"
                    current = family
                continue
            if not line.strip():
                continue
            name, labels, value = _sample(line)
            if current is None or name not in {current.name + suffix for suffix in _SUFFIXES}:
                current = families.setdefault(name, _Family(name))
            current.samples.setdefault((name, labels), []).append(value)
    for text in carried:
        for family, key, value in _samples_of(text, families):
            quantile = family.kind == "summary" and key[0] == family.name
            counts = family.kind in ("counter", "histogram", "summary") and not key[0].endswith("_created")
            if counts and not quantile and key in family.samples:
                family.samples[key].append(value)
    lines: list[str] = []
    for family in families.values():
        lines.extend(header for header in (family.help, family.type) if header is not None)
        rule = _rule(family, shared_cache)
        for (name, labels), values in family.samples.items():
            quantile = family.kind == "summary" and name == family.name
            lines.append(f"{name}{labels} {_largest(values) if quantile else rule(values)}")
    return "\n".join(lines) + "\n" if lines else ""


def _samples_of(text: str, families: dict[str, _Family]) -> Iterator[tuple[_Family, tuple[str, str], str]]:
    """Each sample line of `text` whose family is among `families`: the family, the sample's
    name and labels, its value."""
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, labels, value = _sample(line)
        for suffix in _SUFFIXES:
            family = families.get(name.removesuffix(suffix)) if name.endswith(suffix) else None
            if family is not None:
                yield family, (name, labels), value
                break


def without_model_metrics(text: str, name: str) -> str:
    """`text` without the samples labelled with model `name` (loaded again: its counts start anew)."""
    label = f'model="{_escaped(name)}"'
    kept = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            labels = _sample(line)[1]
            if label in labels:
                continue
        kept.append(line)
    return "\n".join(kept) + "\n" if kept else ""


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample(line: str) -> tuple[str, str, str]:
    """A sample line's name, its labels as written (braces included, '' if none) and value."""
    line = line.strip()
    end = next((i for i, char in enumerate(line) if char in "{ \t"), len(line))
    name, rest = line[:end], line[end:]
    labels = ""
    if rest.startswith("{"):
        quoted = escaped = False
        for index, char in enumerate(rest):
            if escaped:
                escaped = False
            elif char == "\\" and quoted:
                escaped = True
            elif char == '"':
                quoted = not quoted
            elif char == "}" and not quoted:
                labels, rest = rest[: index + 1], rest[index + 1 :]
                break
        else:
            raise ValueError(f"a sample's labels do not end: {line!r}")
    fields = rest.split()
    if not fields:
        raise ValueError(f"a sample has no value: {line!r}")
    return name, labels, fields[0]  # fields[1], a timestamp, is dropped


def _rule(family: _Family, shared_cache: bool) -> Callable[[list[str]], str]:
    if family.name in TAKEN_ONCE or (shared_cache and family.name in SHARED_CACHE):
        return _first
    if family.name in LARGEST:
        return _largest
    if family.name in AVERAGED:
        return _mean
    return _sum


def _first(values: list[str]) -> str:
    return values[0]


def _largest(values: list[str]) -> str:
    numbers = [value for value in values if not math.isnan(float(value))]
    return max(numbers, key=float) if numbers else values[0]


def _mean(values: list[str]) -> str:
    return _float_text(math.fsum(float(value) for value in values) / len(values))


def _sum(values: list[str]) -> str:
    if all(_INTEGER.fullmatch(value) for value in values):
        return str(sum(int(value) for value in values))
    total = 0.0
    for value in values:  # in order, so that a sum of two is exactly what `a + b` gives
        total += float(value)
    return _float_text(total)


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
