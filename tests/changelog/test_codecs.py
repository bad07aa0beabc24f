"""changelog.codecs: one table of value kinds, read by the codecs, the row schema, the
Avro encoder and the C encoder alike."""

from __future__ import annotations

import re

import pytest

from pg2sink.catalog.types import PgType
from pg2sink.changelog.codecs import KINDS, Kind, kind_of
from pg2sink.changelog.rowschema import nullable
from pg2sink.changelog.typemap import ValueCodec, codec_for
from tests.conftest import REPO


def builtin(name: str) -> PgType:
    return PgType(0, name, "pg_catalog", "b", "U")


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


EXPECTED: list[tuple[ValueCodec, Kind]] = [
    (codec_for(builtin("bool"), -1), Kind.BOOLEAN),
    (codec_for(builtin("int2"), -1), Kind.INT),
    (codec_for(builtin("int4"), -1), Kind.INT),
    (codec_for(builtin("int8"), -1), Kind.LONG),
    (codec_for(builtin("oid"), -1), Kind.LONG),
    (codec_for(builtin("xid8"), -1), Kind.TEXT),
    (codec_for(builtin("float4"), -1), Kind.FLOAT),
    (codec_for(builtin("float8"), -1), Kind.DOUBLE),
    (codec_for(builtin("numeric"), -1), Kind.NUMERIC),
    (codec_for(builtin("numeric"), numeric_typmod(10, 2)), Kind.DECIMAL),
    (codec_for(builtin("text"), -1), Kind.TEXT),
    (codec_for(builtin("varchar"), 24), Kind.TEXT),
    (codec_for(builtin("jsonb"), -1), Kind.TEXT),
    (codec_for(builtin("interval"), -1), Kind.TEXT),
    (codec_for(builtin("bytea"), -1), Kind.BYTES),
    (codec_for(builtin("uuid"), -1), Kind.UUID),
    (codec_for(builtin("date"), -1), Kind.DATE),
    (codec_for(builtin("time"), -1), Kind.TIME),
    (codec_for(builtin("timestamp"), -1), Kind.TIMESTAMP),
    (codec_for(builtin("timestamptz"), -1), Kind.TIMESTAMPTZ),
    (codec_for(PgType(0, "mood", "public", "e", "E"), -1), Kind.TEXT),
    (
        codec_for(PgType(0, "_int4", "pg_catalog", "b", "A", element=builtin("int4")), -1),
        Kind.ARRAY,
    ),
    (codec_for(PgType(0, "pos", "public", "d", "N", base=builtin("int4")), -1), Kind.INT),
]


@pytest.mark.parametrize(("codec", "kind"), EXPECTED, ids=lambda v: getattr(v, "pg_type", v))
def test_codec_kind_and_its_avro_type_come_from_the_table(codec: ValueCodec, kind: Kind) -> None:
    assert codec.kind is kind
    spec = KINDS[kind]
    assert {k: v for k, v in codec.avro.items() if k in spec.avro} == dict(spec.avro)
    # encoders holding only a Schema record read the same kind back from the Avro type
    assert kind_of(codec.avro) is kind
    assert (nullable(codec.avro)[2:] == ["string"]) is spec.narrower
    # a text kind's value is its text: the decoder (JSON too) is bytes.decode
    assert spec.text is (codec.decode is bytes.decode and codec.to_json is bytes.decode)


def test_a_type_no_codec_makes_has_no_kind() -> None:
    with pytest.raises(ValueError, match="no value kind"):
        kind_of({"type": "record", "name": "x", "fields": []})
    with pytest.raises(ValueError, match="no value kind"):
        kind_of({"type": "long", "logicalType": "timestamp-millis"})


def test_native_numbers_are_the_c_encoders_enum() -> None:
    """KINDS[...].native against _avro_native.c's enum Kind, read from the source."""
    source = (REPO / "pg2sink" / "changelog" / "_avro_native.c").read_text()
    enum = re.search(r"enum Kind \{(.*?)\};", source, re.S)
    assert enum is not None
    c_kinds = {name: int(n) for name, n in re.findall(r"K_(\w+) = (\d+)", enum.group(1))}
    # the C code writes text and uuid alike: the text unchanged
    names = {Kind.TEXT: "STRING", Kind.UUID: "STRING"}
    assert {names.get(k, k.name): spec.native for k, spec in KINDS.items()} == c_kinds
