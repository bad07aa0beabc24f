"""psql pattern semantics of -t/-T."""

from __future__ import annotations

import pytest

from pg2sink.errors import ConfigError
from pg2sink.publication.patterns import TableFilter, compile_pattern


@pytest.mark.parametrize(
    ("pattern", "schema", "table", "expected"),
    [
        ("users", "public", "users", True),
        ("users", "other", "users", True),  # no schema part: any selected schema
        ("users", "public", "users2", False),  # anchored
        ("user*", "public", "users2", True),
        ("user?", "public", "users", True),
        ("user?", "public", "user", False),
        ("public.users", "public", "users", True),
        ("public.users", "other", "users", False),
        ("*.users", "other", "users", True),
        ("Users", "public", "users", True),  # unquoted folds to lower case
        ('"Users"', "public", "users", False),  # quoted keeps case
        ('"Users"', "public", "Users", True),
        ('"a.b"', "public", "a.b", True),  # quoted dot is literal
        ('"a*"', "public", "abc", False),  # quoted star is literal
        ('"a*"', "public", "a*", True),
        ('"say ""hi"""', "public", 'say "hi"', True),
        ("t[0-9]", "public", "t5", True),
        ("t[0-9]", "public", "tx", False),
        ("a$b", "public", "a$b", True),  # $ is literal, as in psql
        ("db.public.users", "public", "users", True),
    ],
)
def test_pattern_matching(pattern: str, schema: str, table: str, expected: bool) -> None:
    assert compile_pattern(pattern).matches(schema, table) is expected


@pytest.mark.parametrize("bad", ['"open', "a.b.c.d", ".users", "public.", "t[0-"])
def test_bad_patterns_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        compile_pattern(bad)


def test_exclude_wins_over_include() -> None:
    f = TableFilter.from_patterns(("user*",), ("users_archive",))
    assert f.wants("public", "users")
    assert not f.wants("public", "users_archive")
    assert not f.wants("public", "orders")


def test_no_include_means_everything_not_excluded() -> None:
    f = TableFilter.from_patterns((), ("tmp_*",))
    assert f.wants("public", "orders")
    assert not f.wants("public", "tmp_x")
