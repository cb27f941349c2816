"""tritonserver's --http-header-forward-pattern and --grpc-header-forward-pattern, as patterns
(the headers reaching a model: tests/plugins/python/test_python_models.py)."""

from __future__ import annotations

import pytest

from coreserve import InferenceRequest
from coreserve.errors import InvalidArgumentError
from coreserve.server.headers import HeaderForwarding, checked_pattern


@pytest.mark.parametrize(
    ("pattern", "forwarded"),
    [
        ("MY_HEADER.*", {"my_header_1": "1"}),
        ("(?-i)MY_HEADER.*", {}),
        ("(?-i)my_header.*", {"my_header_1": "1"}),
    ],
)
def test_a_forward_pattern_that_starts_with_re2s_case_flag_is_case_sensitive(
    pattern: str, forwarded: dict[str, str]
) -> None:
    """Triton's patterns are RE2's, and its QA test turns case-sensitivity on with `(?-i)`
    (which Python's `re` refused: the server did not start)."""
    request = InferenceRequest("m", {})
    HeaderForwarding(checked_pattern(pattern)).forward([("my_header_1", "1"), ("other", "2")], request)
    assert request.parameters == forwarded


def test_a_pattern_that_is_no_regular_expression_is_refused_saying_why() -> None:
    with pytest.raises(ValueError, match="not a regular expression"):
        checked_pattern("(?-i)[")


@pytest.mark.parametrize(
    "name", ["sequence_id", "Priority", "timeout", "headers", "binary_data_output", "triton_final_response"]
)
def test_a_matched_header_named_as_a_reserved_parameter_fails_the_request(name: str) -> None:
    """Triton's QA `test_headers_reserved_rejected` (its releases after 2.51)."""
    request = InferenceRequest("m", {})
    with pytest.raises(InvalidArgumentError) as raised:
        HeaderForwarding(".*").forward([("x-tenant", "a"), (name, "dummy-value")], request)
    assert raised.value.message == f"Header '{name}' is reserved for Triton usage and cannot be forwarded."


def test_a_reserved_name_the_pattern_does_not_match_is_not_looked_at() -> None:
    request = InferenceRequest("m", {})
    HeaderForwarding("^x-").forward([("x-tenant", "a"), ("priority", "u=1")], request)
    assert request.parameters == {"x-tenant": "a"}
