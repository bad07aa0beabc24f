"""psql-style table patterns (`-t` / `-T`), as pg_kinesis and pg_dump accept them.

Rules (https://www.postgresql.org/docs/current/app-psql.html#APP-PSQL-PATTERNS):
an unquoted `.` separates schema from table; `*` matches any run of
characters and `?` any one character; unquoted letters fold to lower case;
inside double quotes everything is literal (and `""` is one quote); other
regular-expression syntax such as `[0-9]` passes through. Patterns are
anchored at both ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pg2sink.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TablePattern:
    """A compiled pattern; `schema` is None when the pattern names no schema."""

    text: str
    schema: re.Pattern[str] | None
    table: re.Pattern[str]

    def matches(self, schema: str, table: str) -> bool:
        if self.schema is not None and not self.schema.fullmatch(schema):
            return False
        return self.table.fullmatch(table) is not None


#: a part of a dotted name, as (character, whether it was inside double quotes) pairs
_Part = list[tuple[str, bool]]


def _dotted_parts(text: str) -> list[_Part] | None:
    """`text` cut at its unquoted dots; None when a double quote is unterminated.
    Inside double quotes `""` is one quote character (SQL and psql alike)."""
    parts: list[_Part] = []
    current: _Part = []
    quoted = False
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            if quoted and text[i + 1 : i + 2] == '"':
                current.append(('"', True))
                i += 1
            else:
                quoted = not quoted
        elif c == "." and not quoted:
            parts.append(current)
            current = []
        else:
            current.append((c, quoted))
        i += 1
    if quoted:
        return None
    parts.append(current)
    return parts


#: what an unquoted pattern character means as a regular expression
_WILDCARDS = {"*": ".*", "?": ".", "$": re.escape("$")}


def _split(pattern: str) -> list[str]:
    """Convert each dot-separated part of a psql pattern to a regex."""
    parts = _dotted_parts(pattern)
    if parts is None:
        raise ConfigError(f"table pattern {pattern!r} has an unterminated double quote")
    return [
        "".join(re.escape(c) if quoted else _WILDCARDS.get(c, c.lower()) for c, quoted in part)
        for part in parts
    ]


def compile_pattern(text: str) -> TablePattern:
    """Compile one `-t`/`-T` value; ConfigError when it is not a valid pattern."""
    parts = _split(text)
    if len(parts) > 3 or any(p == "" for p in parts):
        raise ConfigError(
            f"table pattern {text!r} is not of the form table, schema.table or db.schema.table"
        )
    try:
        table = re.compile(parts[-1])
        schema = re.compile(parts[-2]) if len(parts) >= 2 else None
    except re.error as e:
        raise ConfigError(f"table pattern {text!r} is not valid: {e}") from None
    return TablePattern(text=text, schema=schema, table=table)


@dataclass(frozen=True)
class TableFilter:
    """Which tables of the selected schemas belong in the publication."""

    include: tuple[TablePattern, ...] = ()
    exclude: tuple[TablePattern, ...] = ()

    @classmethod
    def from_patterns(cls, include: tuple[str, ...], exclude: tuple[str, ...]) -> TableFilter:
        return cls(
            include=tuple(compile_pattern(p) for p in include),
            exclude=tuple(compile_pattern(p) for p in exclude),
        )

    def has_patterns(self) -> bool:
        return bool(self.include or self.exclude)

    def describe(self) -> str:
        """The patterns as given: `-t 'user*' -T 'tmp_*'`."""
        return " ".join(
            [f"-t {p.text!r}" for p in self.include] + [f"-T {p.text!r}" for p in self.exclude]
        )

    def wants(self, schema: str, table: str) -> bool:
        # -T wins over -t; no -t at all means every table.
        if any(p.matches(schema, table) for p in self.exclude):
            return False
        return not self.include or any(p.matches(schema, table) for p in self.include)


def parse_table_name(text: str, flag: str = "--table") -> tuple[str, str]:
    """`schema.table` as SQL reads it → (schema, table); ConfigError otherwise.

    Unquoted parts fold to lower case; double quotes keep a part as written, dots and
    capitals included (`"my.schema".t`). A name with more unquoted dots than one has two
    readings (`my.schema.t`), so it is refused with both spelled out, never guessed."""
    parts = _identifier_parts(text, flag)
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1]
    if len(parts) > 2 and all(parts):
        readings = " or ".join(
            repr(f"{quote_identifier('.'.join(parts[:i]))}.{quote_identifier('.'.join(parts[i:]))}")
            for i in range(1, len(parts))
        )
        raise ConfigError(
            f"invalid {flag} {text!r}: a name with more than one unquoted dot is ambiguous; "
            f"quote the part holding a dot: {readings}"
        )
    raise ConfigError(f"invalid {flag} {text!r}: expected SCHEMA.TABLE")


def _identifier_parts(text: str, flag: str) -> list[str]:
    parts = _dotted_parts(text)
    if parts is None:
        raise ConfigError(f"invalid {flag} {text!r}: unterminated double quote")
    return ["".join(c if quoted else c.lower() for c, quoted in part) for part in parts]


_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")


def quote_identifier(name: str) -> str:
    """`name` as SQL would need it written: as is when plain, else double-quoted."""
    if _PLAIN_IDENTIFIER.fullmatch(name):
        return name
    return '"' + name.replace('"', '""') + '"'


def quote_table_name(schema: str, table: str) -> str:
    """`schema.table` that parse_table_name reads back as (schema, table)."""
    return f"{quote_identifier(schema)}.{quote_identifier(table)}"
