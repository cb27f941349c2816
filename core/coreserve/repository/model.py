"""Models and model versions as the server holds them, with their lifecycle state."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from hashlib import blake2b
from pathlib import Path

from coreserve.backend.api import ModelInstance
from coreserve.config.signature import ModelSignature
from coreserve.errors import CoreserveError, InvalidArgumentError, NotFoundError, UnavailableError, clipped
from coreserve.protos.model_config_pb2 import ModelConfig
from coreserve.repository.traffic.policy import TrafficPolicy, policy_from_config
from coreserve.scheduling import ModelStatistics, Scheduler


class ModelState(enum.StrEnum):
    """Lifecycle states, named as Triton's repository index reports them."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


# What makes two instances alike across reloads (see `plan_instance_changes`).
InstanceKey = tuple[bytes, int]


@dataclass(eq=False)
class ModelVersion:
    """One version of a model: ready with a scheduler, or unavailable with a reason."""

    name: str
    version: int
    config: ModelConfig
    signature: ModelSignature
    statistics: ModelStatistics
    state: ModelState = ModelState.LOADING
    reason: str = ""
    scheduler: Scheduler | None = None
    load_seconds: float = 0.0
    last_used: float = 0.0  # time.time() of its last inference request (0: none yet)
    # Class labels per output (label_filename), for the classification extension.
    labels: dict[str, tuple[bytes, ...]] = field(default_factory=dict)
    # What its version folder held when it loaded (each file's path, size and modification
    # time): a worker of a server of several checks it loaded the same files as the others
    # ("": it loaded none, worker 0 serving it for this worker).
    files_fingerprint: str = ""
    # Its instances, each with what makes it alike another (see `plan_instance_changes`).
    placed: list[tuple[InstanceKey, ModelInstance]] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """What the ready endpoints say: it takes requests and an instance of it is serving."""
        return self.takes_requests and self._an_instance_serves()

    @property
    def takes_requests(self) -> bool:
        """Loaded, and no instance failed: requests are queued (while instances restart too)."""
        return self.state is ModelState.READY and not self.instance_failure()

    def _an_instance_serves(self) -> bool:
        """False while every instance restarts its worker process (see `Scheduler.serving`)."""
        return self.scheduler is None or self.scheduler.serving()

    def instance_failure(self) -> str:
        """Why an instance of this loaded version cannot serve now ("" while every one can;
        see `Scheduler.failure`)."""
        if self.state is not ModelState.READY or self.scheduler is None:
            return ""
        return self.scheduler.failure()

    @property
    def current_state(self) -> ModelState:
        """The state to report: a loaded version whose instance failed is UNAVAILABLE."""
        return ModelState.UNAVAILABLE if self.instance_failure() else self.state

    @property
    def current_reason(self) -> str:
        return self.instance_failure() or self.reason

    @cached_property
    def interface_digest(self) -> str:
        """A short digest of what its configuration says of requests and responses (inputs and
        outputs, by name: their order in the file does not count; batch size; transaction
        policy): two loads that check requests alike agree on it, whatever else their
        configurations change."""
        config = self.config
        interface = ModelConfig(
            max_batch_size=config.max_batch_size, model_transaction_policy=config.model_transaction_policy
        )
        interface.input.extend(sorted(config.input, key=lambda tensor: tensor.name))
        interface.output.extend(sorted(config.output, key=lambda tensor: tensor.name))
        return blake2b(interface.SerializeToString(deterministic=True), digest_size=8).hexdigest()


@dataclass(eq=False)
class Model:
    """A model folder of the repository and the versions loaded from it.

    A model whose configuration cannot be used has no versions; `reason` says why.
    """

    name: str
    path: Path | None
    config: ModelConfig | None = None
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    reason: str = ""
    namespace: str = ""  # its repository, under --model-namespacing
    from_files: bool = False  # loaded from the files its load request carried
    loaded_at: float = 0.0  # time.time() when it became ready
    # The repository's fingerprint of its folder when it loaded (None: loaded from a load
    # request's files, or at another worker's word): see `loaded_from`.
    source_fingerprint: str | None = None
    memory_bytes: int | None = None  # what the server's memory grew by while it loaded
    gpu_memory_bytes: dict[int, int] = field(default_factory=dict)  # and each budgeted GPU's
    # How requests that name no version are shared between its versions (None: the latest).
    traffic: TrafficPolicy | None = None
    # A name the index lists with its reason but Triton would hold no model for (a --load-model
    # name no repository has, a name two repositories hold): the server's readiness leaves it out.
    index_only: bool = False
    # What the files every version uses were when it loaded (`shared_files_fingerprint`).
    shared_files_fingerprint: str = ""
    # The versions a reload kept serving from the model it replaces: the same objects, until
    # `settle_kept` leaves them to one of the two.
    kept: frozenset[int] = frozenset()

    def settle_kept(self, old: Model | None, serves: bool) -> None:
        """Leaves the versions this reload kept to one model, so that closing the other closes
        none of them: to this one where it `serves` from now on (they take its configuration,
        which differs in the version policy and instance groups at most), else back to `old`."""
        if old is None:
            return
        for number in self.kept:
            if serves:
                del old.versions[number]
                self.versions[number].config = self.config or self.versions[number].config
            else:
                del self.versions[number]

    def loaded_from(self, fingerprint: str | None) -> bool:
        """Whether it serves what these files hold: a plain load of them keeps it, as Triton's.
        Not an ensemble: a load of it loads it again, as its steps may have changed since."""
        return (
            self.takes_requests
            and fingerprint is not None
            and self.source_fingerprint == fingerprint
            and not (self.config is not None and self.config.HasField("ensemble_scheduling"))
        )

    def keep_traffic_of(self, old: Model | None, asked: TrafficPolicy | None = None) -> bool:
        """The traffic policy after a (re)load: the one the load request `asked` for, else the
        one set at run time (not by the old configuration) where the new configuration sets
        none. False, with the reason, for a policy that names a version this load dropped: the
        load request must move that version's weight (`coreserve_traffic`), or the policy
        change first."""
        if asked is not None:
            try:
                asked.check_versions(self.name, self.serving_versions())
            except CoreserveError as exc:
                self.reason = exc.message
                return False
            self.traffic = None if asked.empty else asked
            return True
        if old is None or old.traffic is None or self.traffic is not None or old.config is None:
            return True
        if old.traffic == policy_from_config(old.config):
            return True  # the old configuration's own: the new one says what holds now
        dropped = sorted(old.traffic.versions() - set(self.versions))
        if dropped:
            self.reason = (
                f"version {', '.join(map(str, dropped))} takes requests under the model's traffic policy; "
                "set a policy without it first, or load with parameter coreserve_traffic"
            )
            return False
        # A version with no weight may go: the policy stops naming it.
        gone = {version for version, weight in old.traffic.weights if not weight} - set(self.versions)
        weights = tuple((version, weight) for version, weight in old.traffic.weights if version not in gone)
        self.traffic = replace(old.traffic, weights=weights) if gone else old.traffic
        return True

    def last_used(self) -> float:
        """When a request last used a version of it, or when it loaded if none did since."""
        return max([self.loaded_at, *(v.last_used for v in self.versions.values())])

    def in_flight(self) -> int:
        """Requests queued or executing in its versions."""
        return sum(v.scheduler.in_flight for v in self.versions.values() if v.scheduler is not None)

    @property
    def state(self) -> ModelState:
        if any(v.ready for v in self.versions.values()):
            return ModelState.READY
        if any(v.state is ModelState.LOADING for v in self.versions.values()):
            return ModelState.LOADING
        return ModelState.UNAVAILABLE

    @property
    def ready(self) -> bool:
        """True if every version the policy selected is ready."""
        return bool(self.versions) and all(v.ready for v in self.versions.values())

    @property
    def takes_requests(self) -> bool:
        """True if every version the policy selected takes requests (see ModelVersion)."""
        return bool(self.versions) and all(v.takes_requests for v in self.versions.values())

    def steps(self) -> frozenset[str]:
        """The models an ensemble's steps call (none for a model of another kind)."""
        config = self.config
        if config is None or not config.HasField("ensemble_scheduling"):
            return frozenset()
        return frozenset(step.model_name for step in config.ensemble_scheduling.step)

    def serving_versions(self) -> list[int]:
        """The versions that take requests (one whose instances restart included)."""
        return sorted(v.version for v in self.versions.values() if v.takes_requests)

    def version(self, requested: str) -> ModelVersion:
        """The version a request names ("" for the latest that takes requests).

        One whose instances all restart takes requests: they wait in its queue. Ask the
        version's `ready` for what the ready endpoints say.
        """
        if not requested:
            latest = None
            for candidate in self.versions.values():  # (one pass: every request asks this)
                if candidate.takes_requests and (latest is None or candidate.version > latest.version):
                    latest = candidate
            if latest is None:
                reason = self.reason or "; ".join(
                    f"version {v.version}: {v.current_reason or v.current_state}"
                    for v in self.versions.values()
                )
                # NOT_FOUND, as Triton 2.51 (HTTP 404); one version not ready is UNAVAILABLE.
                raise NotFoundError(
                    f"Request for unknown model: '{self.name}' has no available versions "
                    f"({reason or 'no versions loaded'})"
                )
            return latest
        number = parse_version(requested)
        found = self.versions.get(number)
        if found is None:
            raise NotFoundError(f"Request for unknown model: '{self.name}' version {number} is not found")
        if not found.takes_requests:
            why = found.current_reason or found.current_state
            raise UnavailableError(
                f"Request for unknown model: '{self.name}' version {number} is not at ready state ({why})"
            )
        return found


def parse_version(text: str) -> int:
    """The version number a request names, read as Triton reads it (std::stoll).

    Leading blanks and a sign are allowed and what follows the digits is ignored ("1x" is 1, as
    in Triton); 0 names no version there is (not found); anything else raises in Triton's words.
    """
    match = _LEADING_INTEGER.match(text)
    number = int(match[1]) if match is not None else None
    if number is None or not -(2**63) <= number < 2**63:
        raise InvalidArgumentError(
            f"failed to get model version from specified version string '{clipped(text)}' (details: stol), "
            "version should be an integral value > 0"
        )
    if number < 0:
        raise InvalidArgumentError(
            f"invalid model version specified '{clipped(text)}' , version should be an integral value > 0"
        )
    return number


_LEADING_INTEGER = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
