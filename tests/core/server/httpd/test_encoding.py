"""Which content coding an Accept-Encoding header gets: q-values ranked as RFC 9110 and Triton 2.51 do."""

from __future__ import annotations

import pytest

from coreserve.server.httpd._encoding import accepted_encoding

# Each answer below is what the real Triton 2.51 sent for the header (None: no Content-Encoding),
# except the case-insensitive name, which RFC 9110 asks for.
TRITON_ANSWERS = [
    ("gzip", "gzip"),
    ("deflate", "deflate"),
    ("gzip;q=0", None),
    ("gzip;q=0.0", None),
    ("gzip; q=0", None),
    ("gzip;q=0, deflate", "deflate"),
    ("deflate;q=0.5, gzip;q=0.9", "gzip"),
    ("gzip;q=0.5, deflate;q=0.9", "deflate"),
    ("deflate, gzip", "deflate"),
    ("deflate;q=0.5, gzip;q=0.5", "deflate"),
    ("gzip;q=0.5, identity", None),
    ("gzip, identity;q=0", "gzip"),
    ("identity", None),
    ("*", None),
    ("*;q=0", None),
    ("br", None),
    ("gzip;q=abc", None),
    ("gzip;q=1.5", "gzip"),
]


@pytest.mark.parametrize(("accept", "coding"), TRITON_ANSWERS)
def test_the_highest_acceptable_q_wins_as_triton_chooses(accept: str, coding: str | None) -> None:
    assert accepted_encoding(accept) == coding


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        ("GZIP", "gzip"),
        (" Deflate ;Q=0.3 , br;q=1", "deflate"),
        ("gzip;level=9;q=0.2, deflate;q=0.1", "gzip"),
        ("gzip;q=nan, deflate;q=0.1", "deflate"),
        ("", None),
        (",,;q=1,", None),
    ],
)
def test_names_and_parameters_are_read_loosely(accept: str, coding: str | None) -> None:
    assert accepted_encoding(accept) == coding
