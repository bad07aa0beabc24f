"""pg2sink's own JSON (--format json): the file sink's line of the record without its
newline (formats/jsonlines.py, README "Records"), keyed by the key columns' JSON object."""

from __future__ import annotations

from collections.abc import Mapping

from pg2sink.changelog.records import Modification, Schema
from pg2sink.formats.base import TableEncoder, key_columns, key_of
from pg2sink.formats.jsonenc import dumps
from pg2sink.formats.jsonlines import modification_object

__all__ = ["JsonEncoder"]


class _JsonTable:
    __slots__ = ("_keys",)

    def __init__(self, keys: tuple[str, ...]) -> None:
        self._keys = keys

    def key(self, row: Mapping[str, object]) -> bytes | None:
        return key_of(self._keys, row)

    def value(self, m: Modification) -> bytes:
        return dumps(modification_object(m))


class JsonEncoder:
    """--format json: the bytes the file sink writes, without the newline."""

    def table(self, schema: Schema) -> TableEncoder:
        return _JsonTable(key_columns(schema))
