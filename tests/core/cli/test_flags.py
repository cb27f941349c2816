"""The command line: every tritonserver flag accepted, Triton's booleans, unknown flags refused."""

from __future__ import annotations

import argparse

import pytest

from coreserve.cli._flags import parse_serve_args, serve_parser
from coreserve.cli._options import server_options
from coreserve.cli._triton_flags import TRITON_FLAGS, Effect, accepted_flags_warning
from coreserve.repository import ControlMode
from support.paths import TESTS

# The flags of `tritonserver --help` (2.51), one a line, as the real binary lists them.
TRITON_HELP_FLAGS = (TESTS / "fixtures" / "tritonserver_2_51_flags.txt").read_text().split()

BASE = ["--model-repository=/tmp/models"]
# A value each flag takes, where "1", "true" or "x" would not do.
PLAUSIBLE = {
    "--model-repository": "/tmp/other",
    "--model-store": "/tmp/other",
    "--model-control-mode": "explicit",
    "--log-format": "ISO8601",
    "--log-file": "/tmp/coreserve-test.log",
    "--grpc-infer-response-compression-level": "high",
    "--http-restricted-api": "health:admin-key=secret",
    "--grpc-restricted-protocol": "health:admin-key=secret",
    "--metrics-config": "summary_latencies=false",
    "--backend-config": "python,shm-default-byte-size=1048576",
    "--grpc-server-cert": "/tmp/cert.pem",
    "--grpc-server-key": "/tmp/key.pem",
    "--grpc-root-cert": "/tmp/root.pem",
    "--cuda-memory-pool-byte-size": "0:67108864",
    "--cuda-virtual-address-size": "0:1073741824",
    "--host-policy": "gpu0,numa-node=0",
    "--model-load-gpu-limit": "0:0.8",
    "--rate-limit": "execution_count",
    "--rate-limit-resource": "R1:10:0",
    "--cache-config": "local,size=1048576",
    "--trace-config": "mode=triton",
    "--trace-level": "TIMESTAMPS",
    "--sagemaker-safe-port-range": "8081-9000",
    "--load-model": "*",
}
KIND_VALUES = {"bool": "true", "int": "1", "float": "1.5", "str": "x"}


def _value(name: str, kind: str) -> str:
    return PLAUSIBLE.get(name, KIND_VALUES.get(kind, "x"))


def _extra(name: str) -> list[str]:
    """Flags some flags need beside them (TLS needs its files, --load-model explicit mode)."""
    if name == "--load-model":
        return ["--model-control-mode=explicit"]
    return ["--grpc-server-cert=/c", "--grpc-server-key=/k"] if name.startswith("--grpc-use-ssl") else []


@pytest.mark.parametrize("flag", TRITON_FLAGS, ids=lambda flag: flag.name)
def test_every_tritonserver_flag_is_accepted_in_both_forms(flag) -> None:
    if flag.kind == "":  # a bare switch: it sets its own value to true, and nothing else
        default, given = vars(parse_serve_args(BASE)), vars(parse_serve_args([*BASE, flag.name]))
        changed = {name: value for name, value in given.items() if default[name] != value}
        assert changed == {flag.name.removeprefix("--").replace("-", "_"): True}
        return
    value = _value(flag.name, flag.kind)
    joined = parse_serve_args([*BASE, *_extra(flag.name), f"{flag.name}={value}"])
    separate = parse_serve_args([*BASE, *_extra(flag.name), flag.name, value])
    assert vars(joined) == vars(separate)


def test_the_catalogue_names_each_flag_once_and_explains_the_inert_ones() -> None:
    names = [flag.name for flag in TRITON_FLAGS]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(TRITON_HELP_FLAGS)
    assert all(flag.why for flag in TRITON_FLAGS if flag.effect is not Effect.ACTS)
    # A few of tritonserver 2.51's flags, from each of its help sections.
    for name in (
        "--id",
        "--log-format",
        "--model-config-name",
        "--reuse-http-port",
        "--grpc-keepalive-time",
        "--grpc-restricted-protocol",
        "--sagemaker-port",
        "--vertex-ai-default-model",
        "--metrics-interval-ms",
        "--trace-config",
        "--repoagent-directory",
        "--cache-directory",
        "--rate-limit-resource",
        "--host-policy",
        "--model-load-gpu-limit",
        "--trace-log-frequency",
    ):
        assert name in names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("on", True),
        ("1", True),
        ("false", False),
        ("Off", False),
        ("0", False),
    ],
)
def test_booleans_as_tritonserver_reads_them(text: str, expected: bool) -> None:
    assert parse_serve_args([*BASE, f"--strict-readiness={text}"]).strict_readiness is expected
    assert parse_serve_args([*BASE, "--exit-on-error", text]).exit_on_error is expected


@pytest.mark.parametrize("text", ["yes", "no", "2", ""])
def test_booleans_tritonserver_refuses_are_refused(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args([*BASE, f"--strict-readiness={text}"])
    assert exit_info.value.code == 2
    assert "invalid value for bool option" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("--model-namespace=true", "--model-namespacing"),
        ("--grpc-keepalive-timout", "--grpc-keepalive-timeout"),
        ("--pinned-memory-pool-bytes", "--pinned-memory-pool-byte-size"),
        ("--strict-readyness", "--strict-readiness"),
    ],
)
def test_an_unknown_flag_is_refused_with_the_closest_real_one(
    typed: str, suggested: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args([*BASE, typed, "1"] if "=" not in typed else [*BASE, typed])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized argument: {typed}" in err
    assert f"did you mean {suggested}?" in err


def test_an_unknown_flag_like_nothing_gets_no_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_serve_args([*BASE, "--zzzz"])
    err = capsys.readouterr().err
    assert "unrecognized argument: --zzzz" in err and "did you mean" not in err


def test_one_warning_names_the_inert_flags_given_and_skips_harmless_values() -> None:
    args = parse_serve_args(
        [
            *BASE,
            "--pinned-memory-pool-byte-size=268435456",
            "--cuda-memory-pool-byte-size=0:67108864",
            "--cuda-memory-pool-byte-size=1:67108864",
            "--sagemaker-thread-count",
            "8",
            "--rate-limit=off",  # what coreserve does anyway
            "--allow-sagemaker=false",
            "--model-namespacing=off",
        ]
    )
    warning = accepted_flags_warning(args)
    assert warning is not None
    for name in (
        "--pinned-memory-pool-byte-size",
        "--cuda-memory-pool-byte-size",
        "--sagemaker-thread-count",
    ):
        assert warning.count(name) == 1
    for name in ("--rate-limit", "--allow-sagemaker", "--model-namespacing"):
        assert name not in warning
    assert accepted_flags_warning(parse_serve_args(BASE)) is None


def test_acting_flags_reach_the_server_options() -> None:
    args = parse_serve_args(
        [
            *BASE,
            "--id=edge-7",
            "--model-config-name",
            "h100",
            "--strict-model-config=true",
            "--grpc-restricted-api=statistics:admin-key=secret",  # coreserve's older spelling
            "--grpc-restricted-protocol=health:probe=1",
            "--grpc-keepalive-time=60000",
            "--grpc-keepalive-permit-without-calls=1",
            "--grpc-infer-response-compression-level=medium",
            "--log-verbose=2",
            "--log-info=false",
            "--log-format=ISO8601",
            "--model-load-retry-count=2",
        ]
    )
    options = server_options(args)
    assert options.server_id == "edge-7" and options.model_config_name == "h100"
    assert options.model_load_retry_count == 2
    assert options.auto_complete_config is False
    assert [sorted(r.categories) for r in options.grpc_restricted_api] == [["statistics"], ["health"]]
    transport = options.grpc_transport
    assert (
        dict(transport.server_options()).items()
        >= {
            "grpc.keepalive_time_ms": 60000,
            "grpc.keepalive_permit_without_calls": 1,
            "grpc.default_compression_level": 2,
            "grpc.so_reuseport": 0,
        }.items()
    )
    assert "grpc.keepalive_timeout_ms" not in dict(transport.server_options())  # gRPC's default stays
    log = options.log_settings
    assert (log.log_verbose_level, log.log_info, log.log_warning, log.log_format) == (
        2,
        False,
        True,
        "ISO8601",
    )


def test_the_python_env_cache_dir_is_a_setting_of_the_python_backend() -> None:
    assert "--python-env-cache-dir" in serve_parser().format_help()
    args = parse_serve_args([*BASE, "--backend-config=python,env-build-timeout-secs=60"])
    assert server_options(args).backend_config == {"python": {"env-build-timeout-secs": "60"}}
    args = parse_serve_args(
        [*BASE, "--backend-config=python,env-build-timeout-secs=60", "--python-env-cache-dir=/srv/envs"]
    )
    assert server_options(args).backend_config == {
        "python": {"env-build-timeout-secs": "60", "env-cache-dir": "/srv/envs"}
    }


def test_a_repository_given_twice_is_one_repository_as_on_triton() -> None:
    args = parse_serve_args([*BASE, "--model-repository=/tmp/other", "--model-repository=/tmp/models"])
    assert server_options(args).model_repositories == ["/tmp/models", "/tmp/other"]


def test_explicit_mode_without_load_model_asks_for_nothing() -> None:
    options = server_options(parse_serve_args([*BASE, "--model-control-mode=explicit"]))
    assert options.model_control_mode is ControlMode.EXPLICIT and options.load_models == []


def test_tls_without_its_files_is_a_command_line_mistake(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args([*BASE, "--grpc-use-ssl=true"])
    assert exit_info.value.code == 2
    assert "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key" in capsys.readouterr().err


def test_the_grpc_server_comes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CORESERVE_GRPC_SERVER", raising=False)
    assert server_options(parse_serve_args(BASE)).grpc_server == "native"
    assert server_options(parse_serve_args([*BASE, "--grpc-server=grpcio"])).grpc_server == "grpcio"
    monkeypatch.setenv("CORESERVE_GRPC_SERVER", "grpcio")
    assert server_options(parse_serve_args(BASE)).grpc_server == "grpcio"
    assert server_options(parse_serve_args([*BASE, "--grpc-server", "native"])).grpc_server == "native"
    monkeypatch.setenv("CORESERVE_GRPC_SERVER", "grpc-go")
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(BASE)
    assert exit_info.value.code == 2
    assert "$CORESERVE_GRPC_SERVER must be one of native, grpcio, got 'grpc-go'" in capsys.readouterr().err


def test_negative_numbers_where_tritonserver_wants_counts_are_refused() -> None:
    for flag in ("--log-verbose=-1", "--grpc-keepalive-time=-5", "--model-load-retry-count=-1"):
        with pytest.raises(SystemExit):
            parse_serve_args([*BASE, flag])
    assert isinstance(parse_serve_args([*BASE, "--log-verbose=3"]), argparse.Namespace)


def test_the_grpc_handshake_timeout_takes_positive_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_options(parse_serve_args(BASE)).grpc_transport.handshake_timeout_s == 20.0
    transport = server_options(parse_serve_args([*BASE, "--grpc-handshake-timeout-secs=2.5"])).grpc_transport
    assert transport.handshake_timeout_s == 2.5
    assert dict(transport.server_options())["grpc.server_handshake_timeout_ms"] == 2500  # grpcio's
    for value in ("0", "-1", "soon", "inf", ""):
        with pytest.raises(SystemExit) as exit_info:
            parse_serve_args([*BASE, f"--grpc-handshake-timeout-secs={value}"])
        assert exit_info.value.code == 2
        assert (
            "argument --grpc-handshake-timeout-secs: expected a number of seconds" in capsys.readouterr().err
        )


def test_the_worker_heartbeat_timeout_takes_positive_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_options(parse_serve_args(BASE)).worker_heartbeat_timeout_s == 5.0
    options = server_options(parse_serve_args([*BASE, "--worker-heartbeat-timeout-secs=0.5"]))
    assert options.worker_heartbeat_timeout_s == 0.5
    for value in ("0", "-1", "soon", "inf", "nan", ""):
        with pytest.raises(SystemExit) as exit_info:
            parse_serve_args([*BASE, f"--worker-heartbeat-timeout-secs={value}"])
        assert exit_info.value.code == 2
        assert (
            "argument --worker-heartbeat-timeout-secs: expected a number of seconds"
            in capsys.readouterr().err
        )


def test_load_model_star_goes_alone(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*BASE, "--model-control-mode=explicit", "--load-model=*"]
    assert parse_serve_args(args).load_models == ["*"]
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args([*args, "--load-model=simple"])
    assert exit_info.value.code == 2
    assert "--load-model=* loads every model: name no other" in capsys.readouterr().err


def test_the_metrics_address_follows_the_http_address_unless_given() -> None:
    assert server_options(parse_serve_args(BASE)).metrics_address == "0.0.0.0"
    assert (
        server_options(parse_serve_args([*BASE, "--http-address=127.0.0.1"])).metrics_address == "127.0.0.1"
    )
    given = [*BASE, "--http-address=127.0.0.1", "--metrics-address=0.0.0.0"]
    assert server_options(parse_serve_args(given)).metrics_address == "0.0.0.0"


@pytest.mark.parametrize(
    ("flag", "given", "read"),
    [
        ("--model-control-mode", "EXPLICIT", "explicit"),
        ("--rate-limit", "Execution_Count", "execution_count"),
        ("--grpc-infer-response-compression-level", "HIGH", "high"),
    ],
)
def test_the_values_tritonserver_lowercases_are_taken_in_any_case(flag: str, given: str, read: str) -> None:
    args = parse_serve_args([*BASE, f"{flag}={given}"])
    assert getattr(args, flag.removeprefix("--").replace("-", "_")) == read


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--load-model=simple"], "--load-model needs --model-control-mode=explicit (got none)"),
        (["--model-control-mode=poll", "--load-model=*"], "--load-model needs --model-control-mode=explicit"),
        (
            ["--http-restricted-api=health,statistics:a=1", "--http-restricted-api=health:b=2"],
            "argument --http-restricted-api: restricted api 'health' can not be specified in multiple config groups",
        ),
        (["--grpc-restricted-protocol=health:a="], "expected <category>[,<category>...]:<key>=<value>"),
        # Triton's QA L0_grpc: a gRPC frontend's categories are "protocols" in Triton's words.
        (
            [
                "--grpc-restricted-protocol=model-repository,health:k1=v1",
                "--grpc-restricted-protocol=metadata,health:k2=v2",
            ],
            "restricted protocol 'health' can not be specified in multiple config groups",
        ),
        (
            ["--grpc-restricted-protocol=model-reposit,health:k1=v1"],
            "unknown restricted protocol 'model-reposit'",
        ),
        (["--http-restricted-api=helth:k1=v1"], "unknown restricted api 'helth'"),
    ],
)
def test_flags_triton_refuses_together_are_refused(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_serve_args([*BASE, *flags])
    assert info.value.code == 2 and message in capsys.readouterr().err
