"""The errors' messages as they reach a client: any text, encodable on every wire."""

from __future__ import annotations

import hpack
import orjson

from coreserve.errors import InvalidArgumentError
from coreserve.server.grpc.native.frames import _wire as wire


def test_a_lone_surrogate_in_a_message_is_written_as_its_escape() -> None:
    # json.loads reads '"\\ud800"' as a lone surrogate, which no UTF-8 encoder takes.
    error = InvalidArgumentError("unknown field '\ud800' in 'caf\u00e9'")
    assert error.message == "unknown field '\\ud800' in 'caf\u00e9'"
    assert orjson.loads(orjson.dumps({"error": error.message})) == {"error": error.message}


def test_grpc_trailers_carry_any_text_percent_encoded() -> None:
    block = wire.status_trailers(3, "caf\u00e9 \ud800")
    assert hpack.Decoder().decode(block) == [("grpc-status", "3"), ("grpc-message", "caf%C3%A9 \\ud800")]
