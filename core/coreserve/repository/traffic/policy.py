"""A model's traffic policy: how the requests that name no version are shared between versions.

    weights   {version: percent}: each request that names no version goes to one of these
              versions with that chance; the percents add up to 100. A request with a traffic
              key (`coreserve_traffic_key`) lands on the same version every time while the
              weights stand: its key, hashed, picks the version instead of a random draw.
    shadow    {"version": V, "share": percent, "max_in_flight": N}: that share of the requests
              is also sent to V; its answers are compared with the client's and never reach the
              client; past N copies waiting or running (default 16), further ones are shed.

The policy comes from `config.pbtxt` (parameters `coreserve_traffic_weights: "1:90,2:10"` and
`coreserve_traffic_shadow: "3:100"` or "3:100:16", which Triton ignores) or from the repository API as JSON
(`{"weights": {"1": 90, "2": 10}, "shadow": {"version": "3", "share": 100}}`). Every mistake is
refused whole, naming the problem: nothing is half applied.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from hashlib import blake2b

from coreserve.errors import InvalidArgumentError, clipped
from coreserve.protos.model_config_pb2 import ModelConfig

WEIGHTS_PARAMETER = "coreserve_traffic_weights"
SHADOW_PARAMETER = "coreserve_traffic_shadow"
# Copies one model may have waiting or running at most (each holds its request's inputs).
MAX_SHADOW_IN_FLIGHT = 1024
# Percents add up to 100 within this (clients send 33.3 three times, or floats that round).
_SUM_TOLERANCE = 0.01
_WHOLE = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True, slots=True)
class Shadow:
    """A share of the requests (percent, above 0 and up to 100) also sent to `version`, at most
    `max_in_flight` copies at a time."""

    version: int
    share: float
    max_in_flight: int = 16


@dataclass(frozen=True, slots=True)
class TrafficPolicy:
    """Weights by version (percents that add up to 100, in version order) and a shadow copy."""

    weights: tuple[tuple[int, float], ...] = ()
    shadow: Shadow | None = None
    # The weighted versions and where each one's share of [0, 100) ends, for `pick`.
    _versions: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _ends: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shares = [(version, weight) for version, weight in self.weights if weight > 0]
        object.__setattr__(self, "_versions", tuple(version for version, _ in shares))
        object.__setattr__(self, "_ends", tuple(itertools.accumulate(weight for _, weight in shares)))

    def pick(self, key: str | None) -> int | None:
        """The version a request that names none goes to (None: the policy has no weights). A
        key lands on the same version every time while the weights stand, in every process."""
        if not self._versions:
            return None
        if key is None:
            point = random.random() * 100
        else:
            point = int.from_bytes(blake2b(key.encode(), digest_size=8).digest()) / 2**64 * 100
        index = bisect.bisect_right(self._ends, point)
        return self._versions[min(index, len(self._versions) - 1)]

    @property
    def empty(self) -> bool:
        return not self.weights and self.shadow is None

    def versions(self) -> set[int]:
        """Every version the policy sends requests to."""
        named = {version for version, weight in self.weights if weight > 0}
        return named | ({self.shadow.version} if self.shadow is not None else set())

    def as_dict(self) -> dict[str, object]:
        """The policy as the repository API answers it."""
        answer: dict[str, object] = {"weights": {str(version): weight for version, weight in self.weights}}
        if self.shadow is not None:
            shadow = self.shadow
            answer["shadow"] = {
                "version": str(shadow.version),
                "share": shadow.share,
                "max_in_flight": shadow.max_in_flight,
            }
        return answer

    def check_versions(self, model: str, loaded: Collection[int]) -> None:
        """Refuses a policy that names a version the model does not serve."""
        named = {version for version, _ in self.weights} | self.versions()
        missing = sorted(named - set(loaded))
        if missing:
            names = clipped(", ".join(str(version) for version in missing))
            serving = clipped(", ".join(str(version) for version in sorted(loaded))) or "none"
            raise InvalidArgumentError(
                f"traffic policy of model '{model}' names version {names}, which the model does not "
                f"serve (serving: {serving}); load it first"
            )


def policy_from_document(document: object) -> TrafficPolicy:
    """The policy of a JSON document of the repository API (`{}` clears the policy)."""
    if not isinstance(document, Mapping):
        raise InvalidArgumentError("a traffic policy must be a JSON object")
    unknown = sorted(set(document) - {"weights", "shadow"})
    if unknown:
        raise InvalidArgumentError(
            f"unknown traffic policy field '{clipped(str(unknown[0]))}' (fields: weights, shadow)"
        )
    weights_json = document.get("weights", {})
    if not isinstance(weights_json, Mapping):
        raise InvalidArgumentError("traffic 'weights' must be an object of version: percent")
    weights = _weights(
        [
            (version_number(key, "traffic weights"), _share(value, f"weight of version {key}"))
            for key, value in weights_json.items()
        ]
    )
    shadow_json = document.get("shadow")
    shadow = None
    if shadow_json is not None:
        if (
            not isinstance(shadow_json, Mapping)
            or set(shadow_json) - {"version", "share", "max_in_flight"}
            or "version" not in shadow_json
        ):
            raise InvalidArgumentError(
                'traffic \'shadow\' must be {"version": "V", "share": percent, "max_in_flight": N}'
            )
        version = version_number(shadow_json["version"], "traffic shadow")
        shadow = _shadow(version, shadow_json.get("share", 100), shadow_json.get("max_in_flight", 16))
    return TrafficPolicy(weights, shadow)


def policy_from_config(config: ModelConfig) -> TrafficPolicy | None:
    """The policy a model's configuration sets (None: it sets none)."""
    parameters = config.parameters
    weights_text = parameters[WEIGHTS_PARAMETER].string_value if WEIGHTS_PARAMETER in parameters else ""
    shadow_text = parameters[SHADOW_PARAMETER].string_value if SHADOW_PARAMETER in parameters else ""
    if not weights_text.strip() and not shadow_text.strip():
        return None
    pairs = [_pair(item, WEIGHTS_PARAMETER) for item in weights_text.split(",") if item.strip()]
    weights = _weights(
        [
            (
                version_number(v, f"parameter {WEIGHTS_PARAMETER}"),
                _share(w, f"{WEIGHTS_PARAMETER} of version {v}"),
            )
            for v, w in pairs
        ]
    )
    shadow = None
    if shadow_text.strip():
        version, share = _pair(shadow_text, SHADOW_PARAMETER)
        share, _, bound = share.partition(":")
        shadow = _shadow(version_number(version, f"parameter {SHADOW_PARAMETER}"), share, bound.strip() or 16)
    return TrafficPolicy(weights, shadow)


def _pair(text: str, where: str) -> tuple[str, str]:
    version, colon, value = text.strip().partition(":")
    if not colon:
        raise InvalidArgumentError(f"parameter {where}: '{clipped(text.strip())}' is not VERSION:PERCENT")
    return version.strip(), value.strip()


def version_number(value: object, where: str) -> int:
    """A version as a client writes it ("2" or 2), or a clear InvalidArgumentError."""
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if not _WHOLE.fullmatch(text):  # (0 too: a version folder named 0 is served, as on Triton)
        raise InvalidArgumentError(f"{where}: '{clipped(str(value))}' is not a version number (>= 0)")
    return int(text)


def bounded_number(value: object, where: str, low: float, high: float, *, above_low: bool = False) -> float:
    """A number (or its text) from `low` (excluded with `above_low`) to `high`, or a clear
    InvalidArgumentError naming `where`."""
    if isinstance(value, str):
        text = value
        try:
            value = float(text)
        except ValueError:
            raise InvalidArgumentError(f"{where}: '{clipped(text)}' is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{where} must be a number, got {clipped(repr(value))}")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number) or number < low or number > high or (above_low and number == low):
        bound = f"above {low:g}" if above_low else f"from {low:g}"
        raise InvalidArgumentError(f"{where} must be a number {bound} to {high:g}, got {clipped(str(value))}")
    return number


def _share(value: object, where: str) -> float:
    return bounded_number(value, where, 0, 100)


def _weights(pairs: list[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    versions = [version for version, _ in pairs]
    if len(set(versions)) != len(versions):
        raise InvalidArgumentError("traffic weights name a version twice")
    if pairs:
        total = sum(weight for _, weight in pairs)
        if abs(total - 100) > _SUM_TOLERANCE:
            raise InvalidArgumentError(f"traffic weights must add up to 100, they add up to {total:g}")
    return tuple(sorted(pairs))


def _shadow(version: int, share: object, max_in_flight: object) -> Shadow:
    percent = _share(share, "shadow share")
    if percent == 0:
        raise InvalidArgumentError("shadow share must be above 0 (leave 'shadow' out for none)")
    text = str(max_in_flight).strip()
    if (
        isinstance(max_in_flight, bool)
        or not _WHOLE.fullmatch(text)
        or not 1 <= int(text) <= MAX_SHADOW_IN_FLIGHT
    ):
        raise InvalidArgumentError(
            f"shadow max_in_flight must be a whole number from 1 to {MAX_SHADOW_IN_FLIGHT}, "
            f"got {clipped(text)}"
        )
    return Shadow(version, percent, int(text))
