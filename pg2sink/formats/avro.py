"""Avro encoding of typed changes: the Python reference writer of values and keys.

The Kafka sink writes a Modification as an Avro record, the *envelope* of
changelog.avro_schema, whose `before` and `after` fields hold the table's row record; the
key is the record of the key columns. `TableEncoder` writes both, with the schemas it
registers (`value`, `key`).

Row values come from changelog.typemap as typed Python values. The conversion to what the
Avro type stores is chosen per field from `_CONVERTERS` by the field's value kind
(changelog.codecs.KINDS, read back from the Avro type with `kind_of`), once per
table, so a change only runs the precompiled list; fastavro then writes the primitives:

| Avro type (logicalType)        | typed value                 | written as                      |
|--------------------------------|-----------------------------|---------------------------------|
| boolean, int, long, bytes      | bool, int, bytes            | as is                           |
| string (also uuid)             | str; Decimal (numeric)      | as is; format(value, "f")       |
| float, double                  | float; PgText NaN/±Infinity | as is; float(value)             |
| bytes (decimal p,s)            | Decimal                     | unscaled, two's complement (1)  |
| int (date)                     | date                        | days since 1970-01-01           |
| long (time-micros)             | time                        | microseconds after midnight     |
| long (local-timestamp-micros)  | naive datetime              | microseconds since 1970-01-01   |
| long (timestamp-micros)        | datetime in UTC             | microseconds since the epoch    |
| array                          | list                        | list of converted items         |

(1) After quantizing to the scale, which never rounds: a value that would need rounding,
    or more digits than the precision, is an error.

Values outside their Avro type's domain are never an error and never null: the fields (and
array items) of the narrower types have the union ["null", T, "string"]
(typemap.nullable), and such a value is written in the "string" branch as PostgreSQL's
text, exactly the string the JSON encoder writes: a PgText (`infinity`/`-infinity`, BC
and after-9999 dates and timestamps, time `24:00:00`, NaN in numeric(p,s), an array with a
lower bound other than 1) or the text of a PgArray (several dimensions): their
converters raise, and the encoder writes the string instead.
float/double write NaN and the infinities as IEEE values; an unconstrained numeric is an
Avro string, so its NaN and infinities are that text. `UnrepresentableValueError` is left
for values a column cannot hold (a Decimal with more digits than numeric(p,s) allows).
See docs/types.md.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from decimal import Context, Decimal, Inexact, InvalidOperation
from typing import Any

import fastavro

from pg2sink.changelog.avro_schema import envelope_schema, key_schema
from pg2sink.changelog.codecs import Kind, kind_of
from pg2sink.changelog.pgvalues import PgArray, PgText
from pg2sink.changelog.records import Modification, Truncation
from pg2sink.errors import SinkError
from pg2sink.logical.messages import UNCHANGED_TOAST

# envelope_schema and key_schema are re-exported: the schemas TableEncoder registers
__all__ = [
    "TableEncoder",
    "UnrepresentableValueError",
    "avro_long",
    "avro_string",
    "envelope_schema",
    "key_schema",
]

# How much of a value an error message shows.
_PREVIEW_CHARS = 60


class UnrepresentableValueError(SinkError):
    """A value that has no representation in its column's Avro type (terminal)."""


class _NoAvroValueError(ValueError):
    """Raised by a converter; the encoder adds table and column and re-raises."""


# --- value converters: typed value -> what fastavro writes for the Avro type ---
#
# fastavro writes with a copy of the schema stripped of its logical types (`_primitive`):
# a logical type's binary encoding is its underlying type's, so the bytes are the same,
# and the conversions below (micros since the epoch, two's-complement decimal bytes) cost
# less than fastavro's own: with the union tuples of TableEncoder.encode_value, a row
# costs about half as much (bench/avro_writers.py).

Converter = Callable[[object], object]

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _preview(value: object) -> str:
    text = repr(str(value)) if isinstance(value, str) else repr(value)
    return text if len(text) <= _PREVIEW_CHARS else text[: _PREVIEW_CHARS - 3] + "..."


def _no_room(what: str) -> _NoAvroValueError:
    return _NoAvroValueError(f"Avro {what} has no representation for it")


def _to_float(value: object) -> object:
    # float('NaN'), float('Infinity'), float('-Infinity') are exactly PostgreSQL's specials
    return value if value.__class__ is float else float(value)  # type: ignore[arg-type]


def _to_string(value: object) -> object:
    # An unconstrained numeric decodes to Decimal: 'f' keeps PostgreSQL's digits where
    # str() would write 1E-8.
    return format(value, "f") if value.__class__ is Decimal else value


def _date_days(value: object) -> object:
    if value.__class__ is date:
        return value.toordinal() - _EPOCH_ORDINAL
    raise _no_room("date")


def _time_micros(value: object) -> object:
    if value.__class__ is time:
        t: time = value
        return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond
    raise _no_room("time-micros")


# The timedelta's fields give the microseconds faster than `delta // _MICROSECOND`,
# with the same result: days, seconds and microseconds are normalised, only
# days can be negative.


def _local_timestamp_micros(value: object) -> object:
    if value.__class__ is datetime and value.tzinfo is None:
        d = value - _EPOCH_NAIVE
        return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
    raise _no_room("local-timestamp-micros")


def _timestamp_micros(value: object) -> object:
    if value.__class__ is datetime and value.tzinfo is not None:
        d = value - _EPOCH_UTC
        return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
    raise _no_room("timestamp-micros")


def _decimal(avro: Mapping[str, Any]) -> Converter:
    precision, scale = int(avro["precision"]), int(avro.get("scale", 0))
    quantum = Decimal(1).scaleb(-scale)
    # Traps turn a rounding (Inexact) or an overflow of the precision (InvalidOperation)
    # into an error instead of a changed value.
    context = Context(prec=max(precision, 1), traps=[Inexact, InvalidOperation])
    what = f"decimal({precision},{scale})"

    def convert(value: object) -> object:
        if value.__class__ is not Decimal:
            raise _no_room(what)
        try:
            unscaled = int(value.quantize(quantum, context=context).scaleb(scale))
        except (Inexact, InvalidOperation):
            raise _NoAvroValueError(f"it does not fit Avro {what}") from None
        # Avro decimal: the unscaled value, two's-complement big-endian
        return unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)

    return convert


def _special_text(value: object) -> str | None:
    """The PostgreSQL text a "string" branch takes for `value`; None if it has none."""
    if value.__class__ is PgText:
        return str(value)
    if value.__class__ is PgArray:
        text: str = value.text
        return text
    return None


def _has_text_branch(union: Any) -> bool:
    """Whether a union is typemap.nullable's ["null", T, "string"]."""
    return isinstance(union, list) and len(union) == 3 and union[2] == "string"


def _array(avro: Mapping[str, Any]) -> Converter | None:
    items = avro["items"]
    item_type = items[1] if isinstance(items, list) else items
    item = converter_for(item_type)
    text_items = _has_text_branch(items)

    def convert(value: object) -> object:
        if value.__class__ is not list:
            # a PgText (lower bounds other than 1) or a PgArray (several dimensions)
            raise _NoAvroValueError(
                "an array with several dimensions or lower bounds other than 1 has no"
                " representation in the Avro array type"
            )
        out: list[object] = []
        for element in value:
            if element.__class__ is list:
                raise _NoAvroValueError(
                    "a multi-dimensional array has no representation in the Avro array type"
                )
            if element is None or item is None:
                out.append(element)
            else:
                try:
                    out.append(item(element))
                except _NoAvroValueError:
                    text = _special_text(element) if text_items else None
                    if text is None:
                        raise
                    out.append(text)
        return out

    return convert


def _as_is(avro: Mapping[str, Any]) -> Converter | None:
    return None


# value kind (changelog.codecs.KINDS) -> converter factory; a factory returning None
# means "as is". An unconstrained numeric (Decimal) and text share the string converter.
_CONVERTERS: Mapping[Kind, Callable[[Mapping[str, Any]], Converter | None]] = {
    Kind.BOOLEAN: _as_is,
    Kind.INT: _as_is,
    Kind.LONG: _as_is,
    Kind.BYTES: _as_is,
    Kind.TEXT: lambda _: _to_string,
    Kind.NUMERIC: lambda _: _to_string,
    Kind.UUID: _as_is,
    Kind.FLOAT: lambda _: _to_float,
    Kind.DOUBLE: lambda _: _to_float,
    Kind.DECIMAL: _decimal,
    Kind.DATE: lambda _: _date_days,
    Kind.TIME: lambda _: _time_micros,
    Kind.TIMESTAMP: lambda _: _local_timestamp_micros,
    Kind.TIMESTAMPTZ: lambda _: _timestamp_micros,
    Kind.ARRAY: _array,
}


def converter_for(avro: Any) -> Converter | None:
    """The converter of values of Avro type `avro` (None: written as they are), by the
    type's value kind; ValueError for a type no codec makes."""
    if isinstance(avro, str):
        avro = {"type": avro}
    return _CONVERTERS[kind_of(avro)](avro)


def _primitive(schema: Any) -> Any:
    """`schema` without logical types: the schema fastavro writes converted values with."""
    if isinstance(schema, list):
        return [_primitive(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _primitive(v) for k, v in schema.items() if k != "logicalType"}
    if schema.get("logicalType") == "decimal":
        out.pop("precision", None)
        out.pop("scale", None)
    return out


# --- Avro primitives written by hand: the bytes the C encoder is given once per table ---


def avro_long(n: int) -> bytes:
    """Avro long: the zig-zag varint of `n` (a signed 64-bit integer)."""
    zz = (n << 1) ^ (n >> 63)
    out = bytearray()
    while zz >= 0x80:
        out.append((zz & 0x7F) | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


def avro_string(value: str) -> bytes:
    """Avro string: the UTF-8 bytes' length as an Avro long, then the bytes."""
    data = value.encode()
    return avro_long(len(data)) + data


# --- per-table encoder -----------------------------------------------------------------


class _RowConverter:
    """Typed row {column: value} -> Avro record {field: value}, plus unchanged-TOAST fields."""

    __slots__ = ("_fields", "_table")

    def __init__(self, table: str, record: Mapping[str, Any]) -> None:
        self._table = table
        self._fields = tuple(
            (f["pg.column"], f["name"], converter_for(f["type"][1]), _has_text_branch(f["type"]))
            for f in record["fields"]
        )

    def convert(self, row: Mapping[str, object]) -> tuple[dict[str, object], list[str]]:
        out: dict[str, object] = {}
        toast: list[str] = []
        column = ""
        try:
            for column, field, convert, text_branch in self._fields:
                value = row.get(column)
                if value is None:
                    out[field] = None
                elif value is UNCHANGED_TOAST:
                    # null in the body; listed so consumers can tell it from NULL
                    out[field] = None
                    toast.append(field)
                elif convert is None:
                    out[field] = value
                else:
                    try:
                        out[field] = convert(value)
                    except _NoAvroValueError:
                        # outside T's domain: PostgreSQL's text in the "string" branch
                        text = _special_text(value) if text_branch else None
                        if text is None:
                            raise
                        out[field] = text
        except _NoAvroValueError as e:
            raise UnrepresentableValueError(
                f"cannot write {self._table} column {column!r} value "
                f"{_preview(row.get(column))} as Avro: {e}"
            ) from None
        except (TypeError, ValueError, AttributeError) as e:
            raise SinkError(
                f"cannot write {self._table} column {column!r} value "
                f"{_preview(row.get(column))} as Avro: {e}"
            ) from None
        return out, toast


class TableEncoder:
    """Avro bodies (no wire-format header) of one table's changes and keys.

    Built once per Schema record of the table: it parses the envelope and key schemas
    and compiles the row converters, so encoding a change is a dict build plus fastavro.
    This is the reference Python writer; the C encoder (formats.avro_native) writes the
    same bytes for an Insert's or Update's new row when the process runs it.
    """

    __slots__ = (
        "_key",
        "_key_rows",
        "_row_name",
        "_rows",
        "_table",
        "_timestamp",
        "_timestamp_micros",
        "_value",
        "key",
        "value",
    )

    def __init__(
        self,
        namespace: str,
        name: str,
        row: Mapping[str, Any],
        key_columns: Sequence[str] | None = None,
    ) -> None:
        """`row` is a Schema record's schema, `key_columns` its primary_key (key order)."""
        self._table = f"{namespace}.{name}"
        #: the schemas to register (value: the envelope; key: None for tables without a key)
        self.value = envelope_schema(row)
        self.key = key_schema(row, key_columns)
        # fresh named_schemas: every table (and version) defines its own record names
        self._value = fastavro.parse_schema(_primitive(self.value), named_schemas={})
        self._rows = _RowConverter(self._table, row)
        self._row_name = f"{row['namespace']}.{row['name']}"
        self._key: Any = None
        self._key_rows: _RowConverter | None = None
        if self.key is not None:
            self._key = fastavro.parse_schema(_primitive(self.key), named_schemas={})
            self._key_rows = _RowConverter(self._table, self.key)
        # the commit time of the last change, converted (the same for a whole transaction)
        self._timestamp: object = None
        self._timestamp_micros = 0

    def encode_value(self, m: Modification, header: bytes = b"") -> bytes:
        """`header` and the envelope of `m`, Avro binary, through the converters and
        fastavro."""
        # (name, record) picks the union branch: fastavro would otherwise validate the
        # whole record against each branch before writing it (bench/avro_writers.py)
        row_name = self._row_name
        before = (row_name, self._rows.convert(m.before)[0]) if m.before is not None else None
        after: tuple[str, dict[str, object]] | None = None
        toast: list[str] = []
        if m.after is not None:
            converted, toast = self._rows.convert(m.after)
            after = (row_name, converted)
        if m.timestamp is not self._timestamp:
            self._timestamp = m.timestamp
            self._timestamp_micros = (m.timestamp - _EPOCH_UTC) // _MICROSECOND
        record = {
            "timestamp": self._timestamp_micros,
            "sequence": m.sequence,
            "lsn": m.lsn,
            "xid": m.xid,
            "operation": m.operation.value,
            "namespace": m.namespace,
            "name": m.name,
            "before": before,
            "after": after,
            "unchanged_toast": toast,
            "truncate": (
                {"cascade": m.cascade, "restart_identity": m.restart_identity}
                if isinstance(m, Truncation)
                else None
            ),
        }
        return header + self._write(self._value, record)

    def encode_key(self, row: Mapping[str, object], header: bytes = b"") -> bytes | None:
        """`header` and the key record of `row` (a before or after image), Avro binary;
        None for a table without key."""
        if self._key_rows is None:
            return None
        return header + self._write(self._key, self._key_rows.convert(row)[0])

    def _write(self, schema: Any, record: Mapping[str, object]) -> bytes:
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, schema, record)
        except (ValueError, TypeError, OverflowError) as e:
            # fastavro's messages repeat the whole record: keep the first line, shortened.
            reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise SinkError(f"cannot encode a change of {self._table} as Avro: {reason}") from None
        return out.getvalue()
