"""Parsers of the serving flags' values (argparse's `type=`), in tritonserver's syntax."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from coreserve import InvalidArgumentError
from coreserve.cli._triton_flags import parse_bool
from coreserve.server.headers import Restriction, checked_pattern, parse_restriction

if TYPE_CHECKING:
    from coreserve.scheduling.rate_limiter import ResourceSetting


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def backend_config(text: str) -> tuple[str, str, str]:
    backend, _, setting = text.partition(",")
    key, equals, value = setting.partition("=")
    if not backend or not key or not equals:
        raise argparse.ArgumentTypeError(f"expected <backend>,<key>=<value>, got '{text}'")
    return backend, key, value


def cache_setting(text: str) -> tuple[str, str, str]:
    from coreserve.scheduling.cache.config import CacheConfigError, parse_cache_setting

    try:
        return parse_cache_setting(text)
    except CacheConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rate_limit_resource(text: str) -> ResourceSetting:
    from coreserve.scheduling.rate_limiter import RateLimitSettingError, parse_resource_setting

    try:
        return parse_resource_setting(text)
    except RateLimitSettingError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def memory_budget(text: str) -> str:
    """One --model-memory-budget value, checked: BYTES (2GB, 512MiB) or PERCENT of the host's
    memory, or gpu:<id>=BYTES|PERCENT (the values together: `parse_memory_budgets`)."""
    from coreserve.repository.memory.budgets import MemoryBudgetError, parse_memory_budgets

    try:
        parse_memory_budgets([text])
    except MemoryBudgetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {value}")
    return value


def positive_secs(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{text}'") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got '{text}'")
    return value


def stream_limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


# --metrics-config settings (Triton's) and their defaults.
METRICS_SETTINGS = {
    "counter_latencies": "true",
    "summary_latencies": "false",
    "histogram_latencies": "false",
    "summary_quantiles": "0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.0001",
}


def header_pattern(text: str) -> str:
    try:
        return checked_pattern(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def restriction(text: str) -> Restriction:
    """An --http-restricted-api value."""
    try:
        return parse_restriction(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def protocol_restriction(text: str) -> Restriction:
    """A --grpc-restricted-protocol value."""
    try:
        return parse_restriction(text, "protocol")
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def metrics_config(text: str) -> tuple[str, bool | tuple[float, ...]]:
    key, equals, value = text.partition("=")
    if key not in METRICS_SETTINGS or not equals:
        raise argparse.ArgumentTypeError(
            f"expected <setting>=<value> with a setting among {', '.join(METRICS_SETTINGS)}; got '{text}'"
        )
    if key == "summary_quantiles":
        return key, summary_quantiles(value)
    try:
        return key, parse_bool(value)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{key}: {exc}") from None


def summary_quantiles(text: str) -> tuple[float, ...]:
    """Triton's `<quantile>:<error>,...`: the quantiles, each in (0, 1) with an error in [0, 1]."""
    quantiles = []
    for item in text.strip('"').split(","):
        quantile, colon, error = item.partition(":")
        try:
            point, margin = float(quantile), float(error)
        except ValueError:
            point = margin = float("nan")
        if not colon or not 0 < point < 1 or not 0 <= margin <= 1:
            raise argparse.ArgumentTypeError(
                f"summary_quantiles: expected <quantile>:<error>,... with each quantile above 0 and below 1 "
                f"and each error from 0 to 1 (e.g. 0.5:0.05,0.99:0.001); got '{item}'"
            )
        quantiles.append(point)
    return tuple(sorted(set(quantiles)))


def interval_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds, got '{text}'") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds above 0, got '{text}'")
    return value
