"""Masks of column values: what a masked column holds instead of its value.

A mask applies to the column's PostgreSQL text (what its output function prints, as
pgoutput sends it and as an import reads it, imports/reads.py), so the stream and an
import of the same value give the same masked text:

- `hash`: the lower-case hex of HMAC-SHA256(--mask-key, the text's UTF-8 bytes);
  equal values stay equal (joins and keys keep working), the value cannot be read back
  without the key.
- `redact`: the constant REDACTED.
- `truncate:N`: the first N characters.

NULL stays NULL under every mask. In SQL (imports), the HMAC is built from sha256()
(PostgreSQL 11+, no pgcrypto): HMAC(K, m) = H((K' xor opad) || H((K' xor ipad) || m))
(RFC 2104), with the two padded keys as bytea literals.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from pg2sink.errors import ConfigError

__all__ = ["REDACTED", "Mask", "annotate_schema", "parse_mask"]

#: what `redact` puts in place of every non-NULL value
REDACTED = "REDACTED"
_BLOCK = 64  # SHA-256's block size (RFC 2104's B)


@dataclass(frozen=True)
class Mask:
    """One mask; `key` (hash only) never appears in its repr."""

    kind: str
    """'hash', 'redact' or 'truncate'."""
    length: int = 0
    """truncate:N's N."""
    key: bytes = field(default=b"", repr=False)

    @property
    def spec(self) -> str:
        """The mask as --mask-column writes it (and the Schema record's pg.mask says)."""
        return f"truncate:{self.length}" if self.kind == "truncate" else self.kind

    def apply(self, text: bytes) -> bytes:
        """The masked form of a value's PostgreSQL text (UTF-8)."""
        if self.kind == "hash":
            return hmac.new(self.key, text, hashlib.sha256).hexdigest().encode()
        if self.kind == "redact":
            return REDACTED.encode()
        return text.decode()[: self.length].encode()

    def sql(self, text: sql.Composable) -> sql.Composable:
        """The mask as an SQL expression of `text` (a text expression, NULL stays NULL)."""
        if self.kind == "hash":
            inner, outer = self.pads()
            return sql.SQL(
                "encode(sha256({o} || sha256({i} || convert_to({t}, 'UTF8'))), 'hex')"
            ).format(o=sql.Literal(outer), i=sql.Literal(inner), t=text)
        if self.kind == "redact":
            return sql.SQL("CASE WHEN {t} IS NULL THEN NULL ELSE {r} END").format(
                t=text, r=sql.Literal(REDACTED)
            )
        return sql.SQL("left({t}, {n})").format(t=text, n=sql.Literal(self.length))

    def pads(self) -> tuple[bytes, bytes]:
        """HMAC's inner and outer padded keys (RFC 2104): whoever holds them computes the
        HMAC as the key would, so they are as secret as the key."""
        key = self.key if len(self.key) <= _BLOCK else hashlib.sha256(self.key).digest()
        key = key.ljust(_BLOCK, b"\0")
        return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


def parse_mask(text: str, key: str | None, option: str) -> Mask:
    """A mask from its --mask-column spelling (`hash`, `redact`, `truncate:N`)."""
    kind, _, arg = text.partition(":")
    if kind == "hash" and not arg:
        if not key:
            raise ConfigError(f"{option}: the hash mask needs --mask-key (a secret)")
        return Mask("hash", key=key.encode())
    if kind == "redact" and not arg:
        return Mask("redact")
    if kind == "truncate" and arg.isdigit() and int(arg) > 0:
        return Mask("truncate", int(arg))
    raise ConfigError(f"{option}: unknown mask {text!r} (hash, redact or truncate:N, N > 0)")


def annotate_schema(schema: Mapping[str, Any], masks: Mapping[str, Mask]) -> dict[str, Any]:
    """A copy of a row's Avro schema (rowschema.avro_row_schema) whose fields of masked
    columns carry "pg.mask" (the stream's Schema records and an import's alike)."""
    fields = [
        {**f, "pg.mask": masks[f["pg.column"]].spec} if f["pg.column"] in masks else f
        for f in schema["fields"]
    ]
    return {**schema, "fields": fields}
