"""The HTTP limits as the command line gives them, and request-body decompression's checks."""

from __future__ import annotations

import gzip
import zlib

import pytest

from coreserve.cli._flags import serve_parser
from coreserve.cli._options import server_options
from coreserve.server.httpd._encoding import BodyTooLarge, decompress
from coreserve.server.httpd._limits import DEFAULT_HTTP_LIMITS, HttpLimits, default_max_connections

FLAGS = {
    "--http-max-header-count": "max_header_count",
    "--http-max-header-size": "max_header_size",
    "--http-max-url-size": "max_url_size",
    "--http-header-timeout-secs": "header_timeout",
    "--http-body-timeout-secs": "body_timeout",
    "--http-keepalive-timeout-secs": "keepalive_timeout",
    "--http-write-timeout-secs": "write_timeout",
    "--http-max-connections": "max_connections",
    "--http-max-pipelined": "max_pipelined",
}


def _limits(*flags: str) -> HttpLimits:
    args = serve_parser().parse_args(["--model-repository=/models", *flags])
    return server_options(args).http_limits


def test_defaults_come_from_one_place() -> None:
    assert _limits() == DEFAULT_HTTP_LIMITS
    assert DEFAULT_HTTP_LIMITS.connection_limit() == default_max_connections()


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_each_flag_sets_its_limit(flag: str) -> None:
    limits = _limits(f"{flag}=7")
    assert getattr(limits, FLAGS[flag]) == 7
    assert limits.connection_limit() == (7 if flag == "--http-max-connections" else default_max_connections())


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5e400", "nan"])
@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_zero_negative_or_junk_values_are_refused(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _limits(f"{flag}={value}")
    assert exit_info.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_fractional_timeouts_are_accepted() -> None:
    assert _limits("--http-header-timeout-secs=0.5").header_timeout == 0.5


DATA = b'{"inputs": []}' * 50


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("encoding", "body", "expected"),
    [
        ("gzip", gzip.compress(DATA), DATA),
        ("x-gzip", gzip.compress(DATA), DATA),
        ("gzip", gzip.compress(DATA[:100]) + gzip.compress(DATA[100:]), DATA),
        ("deflate", zlib.compress(DATA), DATA),
        ("deflate", _raw_deflate(DATA), DATA),
        ("gzip", gzip.compress(b""), b""),
    ],
    ids=["gzip", "x-gzip", "gzip-two-members", "zlib", "raw-deflate", "gzip-empty"],
)
def test_whole_streams_decompress(encoding: str, body: bytes, expected: bytes) -> None:
    assert decompress(body, encoding, len(DATA)) == expected


@pytest.mark.parametrize(
    ("encoding", "body", "reason"),
    [
        ("gzip", gzip.compress(DATA)[:-8], "truncated"),
        ("gzip", gzip.compress(DATA)[:-1], "truncated"),
        ("gzip", gzip.compress(DATA)[:10], "truncated"),
        ("gzip", gzip.compress(DATA) + b"\n", "1 bytes of trailing data"),
        ("gzip", gzip.compress(DATA) + b"\x1f\x8bjunk", "Error -3 while decompressing"),
        ("deflate", zlib.compress(DATA)[:-4], "truncated"),
        ("deflate", zlib.compress(DATA) + b"tail", "4 bytes of trailing data"),
        ("deflate", _raw_deflate(DATA)[:-2], "truncated"),
        ("gzip", b"not gzip at all", "incorrect header check"),
        ("br", b"whatever", "unsupported Content-Encoding 'br'"),
    ],
    ids=[
        "gzip-no-trailer",
        "gzip-cut-trailer",
        "gzip-cut-header",
        "gzip-newline",
        "gzip-bad-member",
        "zlib-no-trailer",
        "zlib-tail",
        "raw-cut",
        "not-gzip",
        "brotli",
    ],
)
def test_corrupt_truncated_or_padded_streams_are_refused(encoding: str, body: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        decompress(body, encoding, 10 * len(DATA))


@pytest.mark.parametrize(
    "body",
    [gzip.compress(b"\0" * 10_000_000), gzip.compress(DATA) + gzip.compress(DATA)],
    ids=["bomb", "second-member-past-the-limit"],
)
def test_past_the_limit_is_too_large(body: bytes) -> None:
    with pytest.raises(BodyTooLarge):
        decompress(body, "gzip", len(DATA) + 10)
