"""The fixed record set every format's tests encode: one table, public.users, and an
INSERT, an UPDATE (REPLICA IDENTITY FULL: the old row comes too), a DELETE (the default
identity: the old key only) and a TRUNCATE of it, with their values in both forms a sink
may receive (typed Python values, and their JSON form, ValueCodec.to_json's)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from pg2sink.changelog.pgvalues import JsonNumber
from pg2sink.changelog.records import Modification, Operation, Schema, Truncation

#: the transaction's commit time, LSN and xid
COMMIT = datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
LSN = 0x16B3748
XID = 745


def _field(name: str, avro: dict[str, Any], key: bool = False) -> dict[str, Any]:
    """A field of the row record as changelog.typemap writes it (see tests/golden)."""
    return {
        "name": name,
        "type": ["null", avro],
        "default": None,
        "pg.column": name,
        "pg.key": key,
    }


ROW = {
    "type": "record",
    "name": "value",
    "namespace": "public.users",
    "fields": [
        _field("id", {"type": "int", "pg.type": "int4"}, key=True),
        _field("name", {"type": "string", "pg.type": "text"}),
        _field(
            "score",
            {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": 10,
                "scale": 2,
                "pg.type": "numeric(10,2)",
            },
        ),
        _field("active", {"type": "boolean", "pg.type": "bool"}),
        _field(
            "seen", {"type": "long", "logicalType": "timestamp-micros", "pg.type": "timestamptz"}
        ),
        _field("born", {"type": "int", "logicalType": "date", "pg.type": "date"}),
        _field("big", {"type": "long", "pg.type": "int8"}),
        _field(
            "tags",
            {
                "type": "array",
                "items": ["null", {"type": "string", "pg.type": "text"}],
                "pg.type": "text[]",
            },
        ),
        _field("doc", {"type": "string", "pg.type": "jsonb"}),
    ],
    "pg.primary_key": ["id"],
}
SCHEMA = Schema(COMMIT, LSN, "public", "users", ROW, primary_key=("id",))

ANN: dict[str, object] = {
    "id": 1,
    "name": "Ann",
    "score": Decimal("12.50"),
    "active": True,
    "seen": datetime(2024, 5, 1, 9, 30, tzinfo=UTC),
    "born": date(1990, 2, 28),
    "big": 9007199254740993,
    "tags": ["a", None],
    "doc": '{"k": 1}',
}
BO = {**ANN, "name": "Bo", "score": Decimal("13.00"), "active": False}


def _json_form(row: dict[str, object]) -> dict[str, object]:
    """The row in its JSON form (pgvalues' JSON fast path, ValueCodec.to_json)."""
    out = dict(row)
    for name, value in row.items():
        if isinstance(value, Decimal):
            out[name] = JsonNumber(str(value).encode())
        elif isinstance(value, datetime):
            out[name] = value.strftime("%Y-%m-%dT%H:%M:%S") + "Z"
        elif isinstance(value, date):
            out[name] = value.isoformat()
    return out


def _change(op: Operation, sequence: int, before: Any, after: Any) -> Modification:
    return Modification(
        COMMIT, sequence, LSN + 0x28 * sequence, XID, op, "public", "users", before, after
    )


INSERT = _change(Operation.INSERT, 0, None, ANN)
UPDATE = _change(Operation.UPDATE, 1, ANN, BO)
DELETE = _change(Operation.DELETE, 2, {"id": 1}, None)
TRUNCATE = Truncation(COMMIT, 3, LSN + 0x78, XID, Operation.TRUNCATE, "public", "users", None, None)
IMPORT = Modification(COMMIT, 0, LSN, 0, Operation.IMPORT, "public", "users", None, ANN)
CHANGES = {"insert": INSERT, "update": UPDATE, "delete": DELETE, "truncate": TRUNCATE}


def json_form(m: Modification) -> Modification:
    """`m` with its values in their JSON form."""
    before = _json_form(m.before) if m.before is not None else None
    after = _json_form(m.after) if m.after is not None else None
    return Modification(
        m.timestamp, m.sequence, m.lsn, m.xid, m.operation, m.namespace, m.name, before, after
    )
