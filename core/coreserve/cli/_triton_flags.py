"""The catalogue of tritonserver's flags (2.51): what each does here, if anything.

An operator swaps `tritonserver` for `coreserve` and changes nothing else, so every flag of
`tritonserver --help` is accepted. Most act (the command's flags define those); the rest are accepted and
named once in a start-up warning because they mean nothing on this host (CUDA memory pools,
pinned memory, backend shared libraries). A flag that is not Triton's and not ours is refused
with the closest real one.
"""

from __future__ import annotations

import argparse
import difflib
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class Effect(enum.Enum):
    """What a tritonserver flag does in coreserve."""

    ACTS = "acts"  # defined by the command's flags and honoured
    INERT = "inert"  # accepted; means nothing on this host


@dataclass(frozen=True)
class TritonFlag:
    """One flag of `tritonserver --help`."""

    name: str
    effect: Effect
    # The value Triton parses: "bool", "int", "float", "str", or "" for a flag without value.
    kind: str = "str"
    why: str = ""  # for INERT: what the warning says
    repeatable: bool = False
    # Values that ask for nothing coreserve doesn't do anyway: given, they need no warning.
    harmless: tuple[str, ...] = ()


_A, _I = Effect.ACTS, Effect.INERT
_GPU = "no GPU memory management here"
_LIB = "no shared-library plugins here"
_FALSE = ("false", "0", "off")

TRITON_FLAGS: tuple[TritonFlag, ...] = (
    # Server
    TritonFlag("--id", _A),
    TritonFlag("--exit-timeout-secs", _A, "int"),
    # Logging
    TritonFlag("--log-verbose", _A, "int"),
    TritonFlag("--log-info", _A, "bool"),
    TritonFlag("--log-warning", _A, "bool"),
    TritonFlag("--log-error", _A, "bool"),
    TritonFlag("--log-format", _A),
    TritonFlag("--log-file", _A),
    # Model repository
    TritonFlag("--model-store", _A),
    TritonFlag("--model-repository", _A),
    TritonFlag("--exit-on-error", _A, "bool"),
    TritonFlag("--disable-auto-complete-config", _A, ""),
    TritonFlag("--strict-readiness", _A, "bool"),
    TritonFlag("--model-control-mode", _A),
    TritonFlag("--repository-poll-secs", _A, "int"),
    TritonFlag("--load-model", _A),
    TritonFlag("--model-config-name", _A),
    TritonFlag("--model-load-thread-count", _A, "int"),
    TritonFlag("--model-load-retry-count", _A, "int"),
    TritonFlag("--model-namespacing", _A, "bool"),
    TritonFlag("--enable-peer-access", _I, "bool", "no GPUs to connect here"),
    # HTTP
    TritonFlag("--allow-http", _A, "bool"),
    TritonFlag("--http-address", _A),
    TritonFlag("--http-port", _A, "int"),
    TritonFlag("--reuse-http-port", _A, "bool"),
    TritonFlag("--http-header-forward-pattern", _A),
    TritonFlag("--http-thread-count", _A, "int"),
    TritonFlag("--http-restricted-api", _A),
    # gRPC
    TritonFlag("--allow-grpc", _A, "bool"),
    TritonFlag("--grpc-address", _A),
    TritonFlag("--grpc-port", _A, "int"),
    TritonFlag("--reuse-grpc-port", _A, "bool"),
    TritonFlag("--grpc-header-forward-pattern", _A),
    TritonFlag("--grpc-infer-allocation-pool-size", _I, "int", "Python allocates its own messages"),
    TritonFlag("--grpc-use-ssl", _A, "bool"),
    TritonFlag("--grpc-use-ssl-mutual", _A, "bool"),
    TritonFlag("--grpc-server-cert", _A),
    TritonFlag("--grpc-server-key", _A),
    TritonFlag("--grpc-root-cert", _A),
    TritonFlag("--grpc-infer-response-compression-level", _A),
    TritonFlag("--grpc-keepalive-time", _A, "int"),
    TritonFlag("--grpc-keepalive-timeout", _A, "int"),
    TritonFlag("--grpc-keepalive-permit-without-calls", _A, "bool"),
    TritonFlag("--grpc-http2-max-pings-without-data", _A, "int"),
    TritonFlag("--grpc-http2-min-recv-ping-interval-without-data", _A, "int"),
    TritonFlag("--grpc-http2-max-ping-strikes", _A, "int"),
    TritonFlag("--grpc-max-connection-age", _A, "int"),
    TritonFlag("--grpc-max-connection-age-grace", _A, "int"),
    TritonFlag("--grpc-restricted-protocol", _A),
    # SageMaker and Vertex AI: endpoints coreserve does not serve
    TritonFlag("--allow-sagemaker", _I, "bool", "no SageMaker endpoint here", harmless=_FALSE),
    TritonFlag("--sagemaker-port", _I, "int", "no SageMaker endpoint here"),
    TritonFlag("--sagemaker-safe-port-range", _I, "str", "no SageMaker endpoint here"),
    TritonFlag("--sagemaker-thread-count", _I, "int", "no SageMaker endpoint here"),
    TritonFlag("--allow-vertex-ai", _I, "bool", "no Vertex AI endpoint here", harmless=_FALSE),
    TritonFlag("--vertex-ai-port", _I, "int", "no Vertex AI endpoint here"),
    TritonFlag("--vertex-ai-thread-count", _I, "int", "no Vertex AI endpoint here"),
    TritonFlag("--vertex-ai-default-model", _I, "str", "no Vertex AI endpoint here"),
    # Metrics
    TritonFlag("--allow-metrics", _A, "bool"),
    TritonFlag("--allow-gpu-metrics", _A, "bool"),
    TritonFlag("--allow-cpu-metrics", _A, "bool"),
    TritonFlag("--metrics-address", _A),
    TritonFlag("--metrics-port", _A, "int"),
    TritonFlag("--metrics-interval-ms", _A, "float"),
    TritonFlag("--metrics-config", _A),
    # Tracing
    TritonFlag("--trace-config", _A, "str", repeatable=True),
    # Backends, repository agents, caches: shared libraries in Triton
    TritonFlag("--backend-directory", _A),
    TritonFlag("--backend-config", _A),
    TritonFlag("--repoagent-directory", _I, "str", _LIB),
    TritonFlag("--cache-config", _A, "str", repeatable=True),
    TritonFlag("--cache-directory", _I, "str", _LIB),
    # Rate limiter
    TritonFlag("--rate-limit", _A),
    TritonFlag("--rate-limit-resource", _A, "str", repeatable=True),
    # Memory and devices
    TritonFlag("--pinned-memory-pool-byte-size", _I, "int", _GPU),
    TritonFlag("--cuda-memory-pool-byte-size", _I, "str", _GPU, repeatable=True),
    TritonFlag("--cuda-virtual-address-size", _I, "str", _GPU, repeatable=True),
    TritonFlag("--min-supported-compute-capability", _I, "float", _GPU),
    TritonFlag("--buffer-manager-thread-count", _I, "int", "tensors are not copied between devices here"),
    TritonFlag("--host-policy", _I, "str", "no NUMA or core pinning here", repeatable=True),
    TritonFlag("--model-load-gpu-limit", _I, "str", _GPU, repeatable=True),
    # Deprecated in Triton
    TritonFlag("--strict-model-config", _A, "bool"),
    TritonFlag("--response-cache-byte-size", _A, "int"),
    TritonFlag("--trace-file", _A),
    TritonFlag("--trace-level", _A, "str", repeatable=True),
    TritonFlag("--trace-rate", _A, "int"),
    TritonFlag("--trace-count", _A, "int"),
    TritonFlag("--trace-log-frequency", _A, "int"),
)


def parse_bool(text: str) -> bool:
    """A boolean as tritonserver parses one: true/false, on/off or 1/0, in any case."""
    value = text.strip().lower()
    if value in ("true", "on", "1"):
        return True
    if value in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"invalid value for bool option: '{text}' (expected true, false, on, off, 1 or 0)"
    )


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None


_PARSERS: dict[str, Callable[[str], object]] = {"bool": parse_bool, "int": _int, "float": _float, "str": str}


def _dest(flag: TritonFlag) -> str:
    return "triton_" + flag.name.removeprefix("--").replace("-", "_")


def add_accepted_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the flags coreserve accepts without acting on them, in a help group of their own."""
    group = parser.add_argument_group(
        "tritonserver flags accepted without effect",
        "Accepted so that a tritonserver command line runs unchanged; named in a start-up warning.",
    )
    for flag in TRITON_FLAGS:
        if flag.effect is Effect.ACTS:
            continue
        group.add_argument(
            flag.name,
            dest=_dest(flag),
            type=_PARSERS[flag.kind],
            action="append" if flag.repeatable else "store",
            default=None,
            metavar=flag.kind.upper(),
            help=f"{flag.effect.value}: {flag.why}",
        )


def accepted_flags_warning(args: argparse.Namespace) -> str | None:
    """One line naming the accepted flags given that do nothing here, or None when there are none."""
    inert: list[str] = []
    for flag in TRITON_FLAGS:
        if flag.effect is Effect.ACTS:
            continue
        value = getattr(args, _dest(flag), None)
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        texts = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
        if flag.harmless and all(text.lower() in flag.harmless for text in texts):
            continue
        inert.append(f"{flag.name} ({flag.why})")
    if not inert:
        return None
    return "tritonserver flags accepted and ignored; these mean nothing on this host: " + ", ".join(inert)


def refuse_unknown(parser: argparse.ArgumentParser, leftovers: Sequence[str]) -> None:
    """Exits (code 2, as argparse) naming the first unknown argument and the closest real flag."""
    unknown = next((arg for arg in leftovers if arg.startswith("-")), leftovers[0])
    name = unknown.partition("=")[0]
    known = [option for action in parser._actions for option in action.option_strings]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    parser.error(f"unrecognized argument: {unknown}{hint}")
