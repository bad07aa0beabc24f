"""The C encoder of the Kafka sink's hot path: a pgoutput Insert/Update straight to Avro.

Role: `NativeRowEncoder` turns the raw message of an Insert or of an Update without old
tuple into the Kafka message's key and value, Confluent wire format included, in one call
into `_avro_native` (C) per change.

Contract: the bytes are exactly those of the Python path (the row decoded by
changelog.typemap, a Modification, `TableEncoder.encode_value`/`encode_key` with the wire
headers); tests/changelog/test_avro_native.py compares the two on values a real
PostgreSQL sent. `encode` returns None ("declined") for anything it does not handle
exactly: an Update with an old tuple, a binary value, a text form or value the C code does
not expect (infinity, BC dates, NaN in numeric(p,s), a decimal beyond int64, an array with
several dimensions...). The caller then takes the Python path, which writes the record or
reports the problem. `build` returns None for a table with a column type the C code does
not know (arrays of strings, nested arrays), and whenever the process runs the Python
path alone: PG2SINK_IMPL=python, or no extension built (no compiler at install); the
choice is made once, in changelog._cmodule. Importing this module raises the
ConfigError of a PG2SINK_IMPL that cannot run (the CLI has checked it at start).

Why C: the Python path reads the row, builds a Modification and encodes its value and
key through the reference TableEncoder; the C encoder writes the same bytes straight from
the text PostgreSQL sent, at a small fraction of the CPU per change
(bench/avro_writers.py; bench/callgrind_stream.py counts the instructions).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pg2sink.changelog import _cmodule
from pg2sink.changelog.codecs import KINDS, Kind, kind_of
from pg2sink.changelog.records import Operation
from pg2sink.formats.avro import _EPOCH_UTC, TableEncoder, avro_string

if TYPE_CHECKING:
    from pg2sink.changelog._avro_native import RowEncoder

log = logging.getLogger(__name__)

__all__ = ["NativeRowEncoder"]

# a bad PG2SINK_IMPL stops the first user of the encoders here, at its import, not at the
# first row (the CLI checks it before, for every command: one line, exit 2)
_cmodule.check()

_absence_logged = False


#: element kinds an array column may have in C: array_out never escapes their elements.
#: String elements (quoting, backslashes), bytea and anything nested stay on the Python path.
_C_ARRAY_ITEMS = frozenset(KINDS) - {Kind.TEXT, Kind.UUID, Kind.NUMERIC, Kind.BYTES, Kind.ARRAY}


def _union_kind(union: object) -> tuple[Kind, Kind | None, int, int] | None:
    """(kind, item kind, precision, scale) of a field's (or array item's) union, None if
    the C code cannot write it.

    The kinds are those of changelog.codecs.KINDS, whose `native` number is the C code's
    enum Kind. Each kind's text is read as the Python path's decoder reads it: int() for
    int/long, the text itself for text and uuid (text, varchar, bpchar, name, json(b),
    enums, money, xid8...), checked to be numeric_out's for an unconstrained numeric (whose
    format(Decimal(text), "f") is that text again), hex for bytea, float() for
    float/double, Decimal for decimal, fromisoformat for the dates and times.
    """
    # rowschema.nullable: ["null", T] or ["null", T, "string"]; T is branch 1 either way
    if not (
        isinstance(union, list)
        and len(union) in (2, 3)
        and union[0] == "null"
        and (len(union) == 2 or union[2] == "string")
    ):
        return None
    avro: dict[str, Any] = {"type": union[1]} if isinstance(union[1], str) else union[1]
    if not isinstance(avro, dict):
        return None
    try:
        kind = kind_of(avro)
    except ValueError:
        return None
    if kind is Kind.ARRAY:
        item = _union_kind(avro.get("items"))
        if item is None or item[0] not in _C_ARRAY_ITEMS:
            return None
        return Kind.ARRAY, item[0], item[2], item[3]
    if kind is Kind.DECIMAL:
        precision, scale = int(avro["precision"]), int(avro.get("scale", 0))
        if scale < 0 or precision < 0:
            return None
        return kind, None, precision, scale
    return kind, None, 0, 0


def _columns(
    encoder: TableEncoder,
) -> tuple[list[tuple[int, int, int, int, bytes]], list[int] | None] | None:
    """The C encoder's columns of the encoder's row record (kind, item kind, precision,
    scale, the Avro string of the field name for unchanged_toast) and its key (row column
    index of each key field, in key order); None if it has a column the C code cannot
    write."""
    before = next((f for f in encoder.value["fields"] if f["name"] == "before"), None)
    if before is None:
        return None
    row = before["type"][1]
    fields = row["fields"]
    columns: list[tuple[int, int, int, int, bytes]] = []
    for field in fields:
        column = _union_kind(field.get("type"))
        if column is None:
            return None
        kind, item, precision, scale = column
        item_native = KINDS[item].native if item is not None else 0
        columns.append(
            (KINDS[kind].native, item_native, precision, scale, avro_string(field["name"]))
        )
    key: list[int] | None = None
    if encoder.key is not None:
        position = {f["pg.column"]: i for i, f in enumerate(fields)}
        try:
            key = [position[f["pg.column"]] for f in encoder.key["fields"]]
        except KeyError:
            return None
        # the key's fields are copies of the row's: the same bytes for the same value
        if any(encoder.key["fields"][k]["type"] != fields[i]["type"] for k, i in enumerate(key)):
            return None
    return columns, key


#: (data, commit_time, sequence, lsn, xid, op) -> (key, value) | None; see NativeRowEncoder
Encode = Callable[[bytes, datetime, int, int, int, Operation], "tuple[bytes | None, bytes] | None"]


class NativeRowEncoder:
    """One table shape's C encoder: `build` makes one next to the TableEncoder of the same
    Schema record (None: use the TableEncoder alone), the Kafka sink calls `encode` per
    Insert/Update.

    encode(data, commit_time, sequence, lsn, xid, op) -> (key, value) | None: the key and
    value of the Insert/Update message `data` (bytes, as ChangelogBuilder.feed gets it) of
    a transaction committed at `commit_time` with id `xid`, wire headers included; key
    None for a table without key. None: declined, encode the Modification the Python way.
    """

    __slots__ = ("encode",)

    encode: Encode

    def __init__(self, native: RowEncoder) -> None:
        # the C object's own method: calling it is one call into C, no Python frame (a
        # Python wrapper that cached the envelope's parts shows in
        # bench/callgrind_stream.py); the C object caches the commit time's and operation's bytes
        self.encode = native.encode

    @classmethod
    def build(
        cls, encoder: TableEncoder, key_header: bytes, value_header: bytes
    ) -> NativeRowEncoder | None:
        """The C encoder of `encoder`'s table, or None when the C code cannot write its
        rows (a column type it does not know) or the process runs the Python path alone
        (changelog._cmodule).

        `key_header`/`value_header`: the wire-format headers (registry.wire_header) of the
        key and value schema ids; key_header is unused for a table without key.
        """
        global _absence_logged
        row_encoder = _cmodule.ROW_ENCODER
        if row_encoder is None:
            if not _absence_logged:
                _absence_logged = True
                log.debug(
                    "the Kafka sink uses the Python path alone (%s=python, or the C "
                    "extension is not built)",
                    _cmodule.VARIABLE,
                )
            return None
        namespace = encoder.value.get("pg.namespace")
        name = encoder.value.get("pg.table")
        if not isinstance(namespace, str) or not isinstance(name, str):
            return None
        shape = _columns(encoder)
        if shape is None:
            return None
        columns, key = shape
        names = avro_string(namespace) + avro_string(name)
        return cls(row_encoder(columns, key, key_header, value_header, names, _EPOCH_UTC))
