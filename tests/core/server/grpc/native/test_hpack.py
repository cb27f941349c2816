"""The native server's HPACK decoder (RFC 7541) against the `hpack` library's encoder."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coreserve.server.grpc.native.headers._hpack_decoder import (
    HeaderDecodingError,
    HeaderListTooLarge,
    HpackDecoder,
)

names = st.sampled_from([b":path", b"content-type", b"te", b"x-a", b"x-b", b"user-agent", b"grpc-timeout"])
values = st.binary(max_size=300)
header_lists = st.lists(st.tuples(names, values), max_size=12)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    blocks=st.lists(header_lists, min_size=1, max_size=8),
    huffman=st.booleans(),
    table_size=st.sampled_from([0, 100, 4096]),
)
def test_it_decodes_what_an_encoder_writes_block_after_block(
    blocks: list[list[tuple[bytes, bytes]]], huffman: bool, table_size: int
) -> None:
    # The dynamic table must stay in step over many blocks: entries added, evicted, named by index.
    encoder = hpack.Encoder()
    encoder.header_table_size = table_size  # the next block starts with a size update
    decoder = HpackDecoder(4096, 1 << 20)
    for fields in blocks:
        decoded, size = decoder.decode(encoder.encode(fields, huffman=huffman))
        assert decoded == fields
        assert size == sum(len(name) + len(value) + 32 for name, value in fields)


def test_past_the_list_limit_fields_are_counted_not_kept_and_the_table_stays_in_step() -> None:
    # A 4 KB entry named 7 times: 28 kB, past the 16 KiB limit but within twice it.
    encoder = hpack.Encoder()
    decoder = HpackDecoder(4096, 16 * 1024)
    big = (b"x-big", b"v" * 4000)
    decoder.decode(encoder.encode([big]))
    fields, size = decoder.decode(encoder.encode([big] * 7))
    assert len(fields) == 4  # the fields within 16 KiB: 4 of 4,037 bytes
    assert size == 7 * (5 + 4000 + 32)
    # Literals added to the table past the limit are still added: the next block, which names
    # them by index, decodes.
    added = [(b"x-n%d" % i, b"w" * 1000) for i in range(3)]
    decoder.decode(encoder.encode([big] * 4 + added))
    assert decoder.decode(encoder.encode(added))[0] == added


def test_past_twice_the_list_limit_decoding_stops() -> None:
    # An HPACK bomb: one 4 KB entry named 16,000 times in a 16 kB block. Decoding stops at the
    # ninth name, whatever follows.
    encoder = hpack.Encoder()
    decoder = HpackDecoder(4096, 16 * 1024)
    big = (b"x-big", b"v" * 4000)
    decoder.decode(encoder.encode([big]))
    with pytest.raises(HeaderListTooLarge, match="over 32768 bytes"):
        decoder.decode(encoder.encode([big] * 16000))
    with pytest.raises(HeaderListTooLarge, match=r"a header string of 37500 bytes"):  # not decoded at all
        HpackDecoder(4096, 16 * 1024).decode(hpack.Encoder().encode([(b"x", b"s" * 60000)], huffman=True))


@pytest.mark.parametrize(
    ("block", "error"),
    [
        (b"\x80", "index 0"),
        (b"\xbf\x7f", "not in the table"),  # index 190: past the static table and an empty dynamic one
        (b"\x3f\xe2\x1f", "past our setting"),  # a size update to 4097
        (b"\x82\x20", "after a header field"),  # a size update after :method GET
        (b"\x40\x85\xff\xff\xff\xff\xff\x01a", "Huffman"),  # a Huffman name that ends in EOS
        (b"\x00\x0aab\x01c", "past the end"),  # a name of 10 bytes with 2 left
        (b"\x82\x0f", "ends inside"),  # a literal's index cut short
        (b"\xff\xff\xff\xff\xff\x0f", "too long"),  # an integer past 2^28
    ],
    ids=["index-0", "index-past-table", "size-past-setting", "late-size-update", "huffman-eos", "string-past-end", "cut-short", "huge-integer"],
)  # fmt: skip
def test_blocks_that_break_rfc_7541_do_not_decode(block: bytes, error: str) -> None:
    with pytest.raises(HeaderDecodingError, match=error):
        HpackDecoder(4096, 16 * 1024).decode(block)


def test_an_entry_larger_than_the_table_empties_it() -> None:
    encoder = hpack.Encoder()
    decoder = HpackDecoder(4096, 1 << 20)
    decoder.decode(encoder.encode([(b"x-a", b"1")]))
    decoder.decode(encoder.encode([(b"x-huge", b"h" * 5000)]))  # RFC 7541 4.4: the table empties
    with pytest.raises(HeaderDecodingError, match="not in the table"):
        decoder.decode(b"\xbe")  # index 62: the entry x-a had


def test_a_field_rfc_9113_forbids_is_noted_as_a_literal_and_by_index_later() -> None:
    encoder = hpack.Encoder()
    decoder = HpackDecoder(4096, 1 << 20)
    decoder.decode(encoder.encode([(b"x-ok", b"1"), (b"X-Upper", b"2")]))  # added to both tables
    assert decoder.invalid == (b"X-Upper", b"2")
    decoder.decode(encoder.encode([(b"x-ok", b"1")]))  # by index: checked when it entered
    assert decoder.invalid is None
    decoder.decode(encoder.encode([(b"x-ok", b"1"), (b"X-Upper", b"2")]))  # both by index
    assert decoder.invalid == (b"X-Upper", b"2")
    decoder.decode(encoder.encode([(b"x-v", b"a\rb")], huffman=False))
    assert decoder.invalid == (b"x-v", b"a\rb")
    decoder.decode(encoder.encode([(b"x-v", b" both ends ")], huffman=False))
    assert decoder.invalid is None  # (as gRPC's own server takes it: Triton forwards it unchanged)
