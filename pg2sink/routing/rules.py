"""The routing rules, compiled from RoutingConfig: per table, which actions pass and
what becomes of each column.

Patterns are psql's (publication/patterns.py): `--only public.users=insert,update`
names tables, `--exclude-column public.users.password` and `--mask-column
public.users.email=hash` name columns as `[schema.]table.column`, the last unquoted dot
separating the column. A table no --only matches passes every action; a table several
match passes the union of their actions. A column matched by --exclude-column is left
out even when a --mask-column matches it too; of several --mask-column matching one
column the first given wins.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pg2sink.changelog.records import Record, Schema
from pg2sink.errors import ConfigError
from pg2sink.publication.patterns import TablePattern, compile_pattern
from pg2sink.routing.masking import Mask, annotate_schema, parse_mask
from pg2sink.routing.outbox import OutboxRule

__all__ = ["ACTIONS", "ColumnRule", "Rules", "TableRoute", "compile_rules"]

#: the actions --only takes, as the records' operations name them
ACTIONS = ("insert", "update", "delete", "truncate")


@dataclass(frozen=True)
class ColumnRule:
    """Columns of tables matching `table` whose name matches `column`: left out (mask
    None) or masked."""

    text: str
    table: TablePattern
    column: re.Pattern[str]
    mask: Mask | None = None

    def matches(self, schema: str, table: str, column: str) -> bool:
        return self.table.matches(schema, table) and self.column.fullmatch(column) is not None


@dataclass(frozen=True)
class TableRoute:
    """What the rules do to one table."""

    actions: frozenset[str]
    """The actions that pass (lower case, from ACTIONS)."""
    excluded: frozenset[str]
    """Columns left out."""
    masks: tuple[tuple[str, Mask], ...]
    """(column, mask) of the masked columns, in table order."""

    @property
    def changes_columns(self) -> bool:
        return bool(self.excluded or self.masks)

    @property
    def passes_everything(self) -> bool:
        """Whether the table's messages pass as they are."""
        return self.actions == _ALL and not self.changes_columns

    def check_key(self, table: str, key: Sequence[str]) -> None:
        """ConfigError when a key column would be left out, or masked by a mask that
        makes distinct keys equal (only `hash` keeps them distinct)."""
        for column in key:
            if column in self.excluded:
                raise ConfigError(
                    f"--exclude-column {table}.{column}: {column} is a key column of {table}; "
                    "a key column cannot be excluded (consumers identify rows by it)"
                )
        for column, mask in self.masks:
            if column in key and mask.kind != "hash":
                raise ConfigError(
                    f"--mask-column {table}.{column}={mask.spec}: {column} is a key column of "
                    f"{table}; only the hash mask keeps distinct keys distinct"
                )


_ALL = frozenset(ACTIONS)
_EVERYTHING = TableRoute(_ALL, frozenset(), ())


@dataclass(frozen=True)
class Rules:
    """Every rule; `route()` says what they do to one table."""

    only: tuple[tuple[TablePattern, frozenset[str]], ...] = ()
    excluded: tuple[ColumnRule, ...] = ()
    masked: tuple[ColumnRule, ...] = ()
    outbox: tuple[OutboxRule, ...] = ()

    @property
    def active(self) -> bool:
        """Whether any rule exists (without one the stream takes no stage at all)."""
        return bool(self.only or self.excluded or self.masked or self.outbox)

    def without_schema(self, schema: str) -> Rules:
        """These rules, and no change of any table of `schema` passes: pg2sink's internal
        schema when a FOR ALL TABLES publication it does not manage publishes it."""
        every = TablePattern(f"{schema}.*", re.compile(re.escape(schema)), re.compile(".*"))
        return dataclasses.replace(self, only=(*self.only, (every, frozenset())))

    def outbox_for(self, schema: str, table: str) -> OutboxRule | None:
        """The --outbox rule of the table, if it is an outbox (the first that matches)."""
        return next((r for r in self.outbox if r.table.matches(schema, table)), None)

    def unmatched(self, tables: Sequence[tuple[str, str, Sequence[str]]]) -> list[str]:
        """A line per rule that matches nothing among `tables` ((schema, table, columns)
        of the published tables): a typo in a --mask-column rule would otherwise send the
        real column in clear, in silence. The internal schema's rule (no action) is
        pg2sink's own, never reported."""
        out = []
        for pattern, actions in self.only:
            if actions and not any(pattern.matches(s, t) for s, t, _ in tables):
                listed = ",".join(a for a in ACTIONS if a in actions)
                out.append(f"--only {pattern.text}={listed} matches no published table")
        for option, rules in (("--exclude-column", self.excluded), ("--mask-column", self.masked)):
            for rule in rules:
                if not any(rule.matches(s, t, c) for s, t, columns in tables for c in columns):
                    out.append(f"{option} {rule.text} matches no column of a published table")
        for outbox in self.outbox:
            if not any(outbox.table.matches(s, t) for s, t, _ in tables):
                out.append(f"--outbox {outbox.table.text} matches no published table")
        return out

    def annotate(self, record: Record) -> Record:
        """A Schema record whose masked columns' fields say so ("pg.mask": the mask as
        --mask-column wrote it); any other record as it is."""
        if record.__class__ is not Schema or not self.masked:
            return record
        assert isinstance(record, Schema)
        columns = [f["pg.column"] for f in record.schema["fields"]]
        masks = dict(self.route(record.namespace, record.name, columns).masks)
        if not masks:
            return record
        return dataclasses.replace(record, schema=annotate_schema(record.schema, masks))

    def route(self, schema: str, table: str, columns: Sequence[str]) -> TableRoute:
        """What the rules do to `schema`.`table` with these columns."""
        matched = [actions for pattern, actions in self.only if pattern.matches(schema, table)]
        actions = frozenset().union(*matched) if matched else frozenset(ACTIONS)
        excluded = frozenset(
            c for c in columns if any(r.matches(schema, table, c) for r in self.excluded)
        )
        masks = []
        for c in columns:
            mask = next((r.mask for r in self.masked if r.matches(schema, table, c)), None)
            if mask is not None and c not in excluded:
                masks.append((c, mask))
        if not matched and not excluded and not masks:
            return _EVERYTHING
        return TableRoute(actions, excluded, tuple(masks))


def _only(text: str) -> tuple[TablePattern, frozenset[str]]:
    """`TABLE-PATTERN=ACTION[,ACTION...]`."""
    pattern, sep, listed = text.rpartition("=")
    actions = {a.strip().lower() for a in listed.split(",") if a.strip()}
    unknown = actions - set(ACTIONS)
    if not sep or not pattern or not actions or unknown:
        raise ConfigError(
            f"--only {text!r}: expected TABLE=ACTION[,ACTION...] with actions among "
            f"{', '.join(ACTIONS)}"
        )
    return compile_pattern(pattern), frozenset(actions)


def _last_unquoted_dot(text: str) -> int:
    """Index of the last dot outside double quotes, -1 when none."""
    quoted, last = False, -1
    for i, c in enumerate(text):
        if c == '"':
            quoted = not quoted  # `""` inside quotes toggles twice: still quoted
        elif c == "." and not quoted:
            last = i
    return last


def _column_rule(text: str, option: str, mask: Mask | None = None) -> ColumnRule:
    """`[schema.]table.column` (psql patterns) as a ColumnRule."""
    dot = _last_unquoted_dot(text)
    if dot <= 0 or dot == len(text) - 1:
        raise ConfigError(f"{option} {text!r}: expected [SCHEMA.]TABLE.COLUMN (psql patterns)")
    column = compile_pattern(text[dot + 1 :])
    return ColumnRule(text, compile_pattern(text[:dot]), column.table, mask)


def _mask_rule(text: str, key: str | None) -> ColumnRule:
    """`COLUMN-PATTERN[=MASK]` (default: hash)."""
    pattern, sep, spec = text.rpartition("=")
    if not sep or '"' in spec:  # no '=', or it was inside a quoted name
        pattern, spec = text, "hash"
    option = f"--mask-column {pattern}"
    return _column_rule(pattern, "--mask-column", parse_mask(spec, key, option))


def compile_rules(
    only: Sequence[str] = (),
    exclude_columns: Sequence[str] = (),
    mask_columns: Sequence[str] = (),
    mask_key: str | None = None,
    outbox: tuple[OutboxRule, ...] = (),
) -> Rules:
    """The rules of the options; ConfigError for a value that does not parse."""
    return Rules(
        tuple(_only(t) for t in only),
        tuple(_column_rule(t, "--exclude-column") for t in exclude_columns),
        tuple(_mask_rule(t, mask_key) for t in mask_columns),
        outbox,
    )
