"""parse_array against array literals as PostgreSQL 15 prints them (array_out)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pg2sink.changelog.arrays import parse_array


def _text(element: bytes) -> str:
    return element.decode()


def test_flat_ints_with_null() -> None:
    # SELECT '{1,2,NULL}'::int[]
    assert parse_array(b"{1,2,NULL}", int) == [1, 2, None]


def test_empty() -> None:
    assert parse_array(b"{}", int) == []


def test_str_input() -> None:
    assert parse_array("{1,2}", int) == [1, 2]


def test_two_dimensions() -> None:
    assert parse_array(b"{{1,2},{3,4}}", int) == [[1, 2], [3, 4]]


def test_three_dimensions_and_nulls() -> None:
    assert parse_array(b"{{{1},{2}}}", int) == [[[1], [2]]]
    assert parse_array(b"{{NULL,2},{3,NULL}}", int) == [[None, 2], [3, None]]


def test_quoted_elements_and_escapes() -> None:
    # SELECT array['a b','c"d','NULL', 'x\y', '', ' ', 'a,b', '{', 'null', E'\t', 'é']
    printed = b'{"a b","c\\"d","NULL","x\\\\y",""," ","a,b","{","null","\t",\xc3\xa9}'
    assert parse_array(printed, _text) == [
        "a b",
        'c"d',
        "NULL",  # quoted: the string, not a NULL
        "x\\y",
        "",
        " ",
        "a,b",
        "{",
        "null",
        "\t",
        "é",
    ]


def test_quoted_element_keeps_newlines_and_edge_spaces() -> None:
    # SELECT array[E'line\nbreak', ' lead', 'trail ']
    assert parse_array(b'{"line\nbreak"," lead","trail "}', _text) == [
        "line\nbreak",
        " lead",
        "trail ",
    ]


def test_unquoted_null_is_case_insensitive() -> None:
    # array_in takes NULL in any case; array_out always prints it upper case
    assert parse_array(b"{null,NuLl,a}", _text) == [None, None, "a"]
    assert parse_array(b'{"a",null}', _text) == ["a", None]


def test_elements_reach_decoder_as_bytes() -> None:
    seen: list[object] = []

    def record(element: bytes) -> object:
        seen.append(element)
        return element

    parse_array(b'{a,"b c",NULL}', record)
    assert seen == [b"a", b"b c"]


def test_dimension_decoration_is_dropped() -> None:
    # SELECT '[0:1]={1,2}'::int[]; SELECT '[1:1][2:3]={{1,2}}'::int[]
    assert parse_array(b"[0:1]={1,2}", int) == [1, 2]
    assert parse_array(b"[1:1][2:3]={{1,2}}", int) == [[1, 2]]
    assert parse_array(b"[-3:-2]={a,b}", _text) == ["a", "b"]


def test_box_array_uses_semicolon() -> None:
    # SELECT array[box '((1,1),(0,0))', box '((2,2),(1,1))']
    assert parse_array(b"{(1,1),(0,0);(2,2),(1,1)}", _text, ";") == [
        "(1,1),(0,0)",
        "(2,2),(1,1)",
    ]


def test_nested_quoted_json_and_composites() -> None:
    # SELECT array['{"a":1}'::jsonb]; SELECT array[row(1,'a b')]
    assert parse_array(b'{"{\\"a\\": 1}"}', _text) == ['{"a": 1}']
    assert parse_array(b'{"(1,\\"a b\\")"}', _text) == ['(1,"a b")']


def test_quoted_timestamps_and_bytea() -> None:
    # SELECT array['2024-01-01 10:00:00+00'::timestamptz, null]; SELECT array['\x0a'::bytea]
    assert parse_array(b'{"2024-01-01 10:00:00+00",NULL}', _text) == [
        "2024-01-01 10:00:00+00",
        None,
    ]
    assert parse_array(b'{"\\\\x0a"}', _text) == ["\\x0a"]


def test_bpchar_padding_is_kept() -> None:
    # SELECT array['abc'::char(5)]
    assert parse_array(b'{"abc  "}', _text) == ["abc  "]


def test_multidimensional_text() -> None:
    assert parse_array(b'{{"a b",c},{NULL,"}"}}', _text) == [["a b", "c"], [None, "}"]]


def test_whitespace_accepted_like_array_in() -> None:
    assert parse_array(b" { 1 , 2 } ", int) == [1, 2]
    assert parse_array(b"{ {1,2} , {3,4} }", int) == [[1, 2], [3, 4]]
    assert parse_array(b"{a b , c}", _text) == ["a b", "c"]


def test_backslash_in_unquoted_element() -> None:
    assert parse_array(b"{a\\,b,c\\ }", _text) == ["a,b", "c "]
    assert parse_array(b"{N\\ULL}", _text) == ["NULL"]  # escaped: not a NULL


def _strict_decimal(element: bytes) -> object:
    if element == b"x":
        raise ArithmeticError("not a number")
    return Decimal(element.decode())


def test_decoder_errors_propagate() -> None:
    with pytest.raises(ArithmeticError):
        parse_array(b"{1,x}", _strict_decimal)
    with pytest.raises(ArithmeticError):
        parse_array(b'{{"1"},{x}}', _strict_decimal)


@pytest.mark.parametrize(
    "literal",
    [
        b"",
        b"1,2",
        b"{1,2",
        b"1,2}",
        b"{1,,2}",
        b"{,}",
        b"{1,}",
        b'{"a}',
        b'{"a"b}',
        b"{{1,2},3}",
        b"{1,{2,3}}",
        b"{{1,2},{3}}",
        b"{{1},{{2}}}",  # PostgreSQL 15's array_in takes it (16 does not); never printed
        b"{{},{}}",
        b"{1}x",
        b"{1} {2}",
        b"[0:1]{1,2}",
        b"[a:b]={1}",
        b'{a"b}',
        b"{a{b}",
        b"{a\\",
    ],
)
def test_malformed(literal: bytes) -> None:
    with pytest.raises(ValueError, match="malformed array literal"):
        parse_array(literal, _text)


def test_bad_delimiter() -> None:
    with pytest.raises(ValueError, match="delimiter"):
        parse_array(b"{1}", int, "ab")
