"""relay/names.py: a table arriving from a second topic is refused, or, with
--relay-schema-prefix, named after its topic's prefix."""

from __future__ import annotations

import pytest

from pg2sink.errors import SinkError
from pg2sink.relay.names import TableNames, topic_prefix


def test_a_second_topic_of_one_table_is_refused() -> None:
    names = TableNames(schema_prefix=False)
    assert names.namespace("a.public.t", "public", "t") == "public"
    assert names.namespace("a.public.u", "public", "u") == "public"
    assert names.namespace("a.public.t", "public", "t") == "public"  # again: the same
    with pytest.raises(SinkError, match=r"public\.t comes from topics 'a.public.t' and 'b"):
        names.namespace("b.public.t", "public", "t")


def test_schema_prefix_keeps_equal_names_apart() -> None:
    names = TableNames(schema_prefix=True)
    assert names.namespace("a.public.t", "public", "t") == "a_public"
    assert names.namespace("b.public.t", "public", "t") == "b_public"
    assert names.namespace("prod.shop.sales.t", "sales", "t") == "prod.shop_sales"
    assert names.namespace("orders", "public", "orders") == "orders_public"  # --topic-map


def test_topic_prefix() -> None:
    assert topic_prefix("a.public.t", "public", "t") == "a"
    assert topic_prefix("public.t", "public", "t") == "public.t"
    assert topic_prefix(".public.t", "public", "t") == ".public.t"
