"""The Confluent wire format: magic byte 0, the schema id as 4 bytes big-endian, the body.

https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/index.html#wire-format
"""

from __future__ import annotations

MAGIC_BYTE = 0


def wire_header(schema_id: int) -> bytes:
    """The 5 bytes that precede an Avro body written with schema `schema_id`."""
    return bytes((MAGIC_BYTE,)) + schema_id.to_bytes(4, "big")
