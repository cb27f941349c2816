"""HPACK decoding (RFC 7541) of request header blocks, within limits on the decoded list.

A block of a few bytes can name a large dynamic-table entry thousands of times (an "HPACK
bomb"). Past the list's limit this decoder goes on reading the block, so that its dynamic table
stays in step with the client's encoder, but it keeps no more fields, and the caller learns the
list's full size to refuse the request (as grpc's core does past its metadata limit). Past
twice the limit it stops at once (as Go's server does): no request needs that much, so the
connection ends, and a bomb costs what a list of twice the limit costs, whatever it names.

Fields whose name or value RFC 9113 (8.2.1) does not allow are noted as their literal is read;
a field named by index was checked when it entered the table (the static table's are valid),
so a block of indexed fields costs no check.
"""

from __future__ import annotations

import re
from collections import deque

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

Field = tuple[bytes, bytes]

_STATIC: tuple[Field, ...] = HeaderTable.STATIC_TABLE
# RFC 7541 4.1: an entry's size counts its name, its value and 32; RFC 9113 counts a header
# list's size the same way.
ENTRY_OVERHEAD = 32
# An integer this long (in continuation bytes) is past any size this decoder accepts.
_MAX_INTEGER_BYTES = 4
# RFC 9113 8.2.1: a name of visible ASCII but upper case letters and colons (a pseudo-header's
# leading one aside); a value without NUL, CR or LF. White space at either end, which RFC 9113
# forbids too, is taken as gRPC's own server takes it (Triton forwards such a value unchanged).
_VALID_NAME = re.compile(rb":?[!-9;-@\[-~]+")
_INVALID_VALUE = re.compile(rb"[\0\r\n]")


class HeaderDecodingError(Exception):
    """The block does not decode: the connection's compression context is lost."""


class HeaderListTooLarge(Exception):
    """The block's list passed twice the limit: decoding stopped there."""


class HpackDecoder:
    """One connection's decoder: its dynamic table and the limits it decodes within."""

    def __init__(self, max_table_size: int, max_list_size: int) -> None:
        self._stop_size = 2 * max_list_size
        self._entries: deque[Field] = deque()  # newest first: index 62 is _entries[0]
        self._table_size = 0
        self._max_table_size = max_table_size  # as the client's last size update set it
        self._table_limit = max_table_size  # our SETTINGS_HEADER_TABLE_SIZE
        self.max_list_size = max_list_size
        self.changes = 0  # counts the changes that shift what an index means
        self._invalid_entries: dict[Field, int] = {}  # table entries RFC 9113 forbids, counted
        self.invalid: Field | None = None  # the last block's first field RFC 9113 forbids

    def decode(self, block: bytes) -> tuple[list[Field], int]:
        """The fields of `block` that fit within the list limit, and the list's full size.

        Where the size passes `max_list_size`, the fields are those before the one that passed
        it; HeaderListTooLarge where it passes twice that. HeaderDecodingError where the block
        breaks RFC 7541.
        """
        try:
            return self._decode(block)
        except IndexError:  # a field or integer runs past the block's end
            raise HeaderDecodingError("a header block ends inside a field") from None
        except HPACKDecodingError as exc:  # a bad Huffman string
            raise HeaderDecodingError(str(exc)) from None

    def _decode(self, block: bytes) -> tuple[list[Field], int]:
        fields: list[Field] = []
        self.invalid = None
        size = 0
        limit = self.max_list_size
        stop = self._stop_size
        position = 0
        end = len(block)
        while position < end:
            byte = block[position]
            if byte & 0x80:  # an indexed field
                index, position = _integer(block, position, 0x7F)
                field = self._field(index)
                if self._invalid_entries and field in self._invalid_entries:
                    self.invalid = self.invalid or field
            elif byte & 0x40:  # a literal added to the table
                field, position, valid = self._literal(block, position, 0x3F)
                self._add(field, valid)
                if not valid:
                    self.invalid = self.invalid or field
            elif byte & 0x20:  # a dynamic table size update: only before the first field
                if size:
                    raise HeaderDecodingError("a table size update after a header field")
                new_size, position = _integer(block, position, 0x1F)
                if new_size > self._table_limit:
                    raise HeaderDecodingError(f"a table size update to {new_size} bytes, past our setting")
                self._max_table_size = new_size
                self._evict(0)
                continue
            else:  # a literal without indexing (0000) or never indexed (0001)
                field, position, valid = self._literal(block, position, 0x0F)
                if not valid:
                    self.invalid = self.invalid or field
            size += len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
            if size <= limit:
                fields.append(field)
            elif size > stop:
                raise HeaderListTooLarge(f"a header list over {stop} bytes")
        return fields, size

    def _literal(self, block: bytes, position: int, mask: int) -> tuple[Field, int, bool]:
        """RFC 7541 6.2: a literal field, its name indexed (under `mask`) or literal too; the
        position after it, and whether RFC 9113 allows it."""
        index, position = _integer(block, position, mask)
        if index:
            name = self._field(index)[0]
        else:
            name, position = _string(block, position, self._stop_size)
        value, position = _string(block, position, self._stop_size)
        valid = _VALID_NAME.fullmatch(name) is not None and _INVALID_VALUE.search(value) is None
        return (name, value), position, valid

    def _field(self, index: int) -> Field:
        if 0 < index <= len(_STATIC):
            return _STATIC[index - 1]
        dynamic = index - len(_STATIC) - 1
        if 0 <= dynamic < len(self._entries):
            return self._entries[dynamic]
        raise HeaderDecodingError(f"header table index {index} is not in the table")

    def _add(self, field: Field, valid: bool) -> None:
        """RFC 7541 4.4: an entry larger than the table empties it and is not added."""
        self.changes += 1
        entry = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
        self._evict(entry)
        if entry <= self._max_table_size:
            self._entries.appendleft(field)
            self._table_size += entry
            if not valid:
                self._invalid_entries[field] = self._invalid_entries.get(field, 0) + 1

    def _evict(self, room: int) -> None:
        """Drops the oldest entries until `room` more bytes fit under the table's size."""
        entries = self._entries
        while entries and self._table_size + room > self._max_table_size:
            field = entries.pop()
            self._table_size -= len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
            self.changes += 1
            if field in self._invalid_entries:
                self._invalid_entries[field] -= 1
                if not self._invalid_entries[field]:
                    del self._invalid_entries[field]
        if not entries:
            self._table_size = 0


def _integer(block: bytes, position: int, mask: int) -> tuple[int, int]:
    """RFC 7541 5.1: the integer whose prefix is `mask` of block[position]; and the position after it."""
    value = block[position] & mask
    position += 1
    if value < mask:
        return value, position
    shift = 0
    while True:
        byte = block[position]
        position += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift >= 7 * _MAX_INTEGER_BYTES:
            raise HeaderDecodingError("an integer too long for a header block")


def _string(block: bytes, position: int, stop: int) -> tuple[bytes, int]:
    """RFC 7541 5.2: a string literal (Huffman-coded or not); and the position after it. One
    longer than `stop` is not decoded (HeaderListTooLarge)."""
    huffman = block[position] & 0x80
    length, position = _integer(block, position, 0x7F)
    if length > stop:
        raise HeaderListTooLarge(f"a header string of {length} bytes")
    end = position + length
    if end > len(block):
        raise HeaderDecodingError("a string runs past the end of its header block")
    data = block[position:end]
    return (decode_huffman(data) if huffman else data), end
