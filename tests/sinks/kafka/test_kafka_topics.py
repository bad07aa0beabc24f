"""Topic names: one topic (and one pair of registry subjects) per table, unless asked.

Against a real PostgreSQL, Kafka broker and schema registry: tables whose names differ
only by characters Kafka cannot hold, or by where a '.' sits, go to distinct topics; a
shared topic made by --topic-map is accepted; an accidental one stops pg2sink (exit 2).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from pg2sink.errors import ConfigError, SinkError
from pg2sink.sinks.kafka.topics import TopicRouter, escape_identifier, topic_name
from tests.conftest import Database, KafkaStack
from tests.sinks.kafka import test_kafka
from tests.sinks.kafka.kafka_support import create_topic
from tests.sinks.kafka.test_kafka import Reader, registry_get, start
from tests.support import Proc

reader = test_kafka.reader  # the fixture


def test_plain_identifiers_keep_their_topic() -> None:
    assert TopicRouter("pg2sink", {}).topic("public", "users") == "pg2sink.public.users"
    assert topic_name("p", "app_2", "Order_Items9") == "p.app_2.Order_Items9"


def test_other_characters_are_escaped_reversibly() -> None:
    assert topic_name("p", "public", "order items") == "p.public.order-20items"
    assert topic_name("p", "my.schema", "t") == "p.my-2eschema.t"
    assert topic_name("p", "my", "schema.t") == "p.my.schema-2et"
    assert topic_name("p", "public", "Größe") == "p.public.Gr-c3-b6-c3-9fe"
    assert topic_name("p", "a-b", "x") == "p.a-2db.x"  # the escape character itself
    assert topic_name("my prefix", "s", "t") == "my_prefix.s.t"  # the prefix as before


def test_default_topics_are_injective() -> None:
    alphabet = "aA_0.-ä €\"'"
    rng = random.Random(11)
    names = {"".join(rng.choices(alphabet, k=rng.randint(1, 4))) for _ in range(400)}
    escaped = {escape_identifier(n): n for n in names}
    assert len(escaped) == len(names)
    assert all("." not in e for e in escaped)  # '.' only ever separates the parts
    pairs = list(itertools.product(sorted(names)[:60], repeat=2))
    assert len({topic_name("p", s, t) for s, t in pairs}) == len(pairs)


def test_kafka_collisions_and_overlong_names_are_refused() -> None:
    router = TopicRouter("p", {})
    assert router.topic("a_b", "c") == "p.a_b.c"
    assert router.topic("a_b", "c") == "p.a_b.c"  # the same table again
    with pytest.raises(SinkError, match=r"tables a_b\.c and a\.b_c would share a Kafka topic"):
        router.topic("a", "b_c")
    with pytest.raises(SinkError, match=r"more than Kafka's 249: route it with --topic-map"):
        router.topic("public", "é" * 63)
    with pytest.raises(ConfigError, match=r"topics 'x\.y' and 'x_y' collide in Kafka"):
        TopicRouter("p", {"public.a": "x.y", "public.b": "x_y"})
    with pytest.raises(ConfigError, match=r"invalid topic 'a b'"):
        TopicRouter("p", {}, "a b")
    # --topic-map reads quoted names as SQL does, and never guesses between two readings
    quoted = TopicRouter("p", {'"my.schema".t': "x", "public.Users": "u"}, "rest")
    assert quoted.topic("my.schema", "t") == "x" and quoted.topic("my", "schema.t") == "rest"
    assert quoted.topic("public", "Users") == "u"  # unquoted and one dot: as written
    with pytest.raises(ConfigError, match=r"""dot: 'my\."schema\.t"' or '"my\.schema"\.t'"""):
        TopicRouter("p", {"my.schema.t": "x"})
    # one topic for two tables, on purpose
    shared = TopicRouter("p", {"public.a": "both", "public.b": "both"})
    assert shared.topic("public", "a") == shared.topic("public", "b") == "both"


@pytest.mark.slow
def test_lookalike_tables_get_their_own_topics_and_subjects(
    db: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    reader: Callable[..., Reader],
) -> None:
    conn = db.connect()
    conn.execute('CREATE SCHEMA "my.schema"')
    conn.execute("CREATE SCHEMA my")
    tables = {
        'public."order items"': f"{topic_prefix}.public.order-20items",
        "public.order_items": f"{topic_prefix}.public.order_items",
        '"my.schema".t': f"{topic_prefix}.my-2eschema.t",
        'my."schema.t"': f"{topic_prefix}.my.schema-2et",
    }
    for table in tables:
        conn.execute(f"CREATE TABLE {table} (id int primary key, origin text)")
    schemas = ("--schema", "public", "--schema", "my.schema", "--schema", "my")
    p = start(pg2sink_proc, kafka_stack, topic_prefix, *schemas)
    for table in tables:
        conn.execute(f"INSERT INTO {table} VALUES (1, %s)", (table,))
    read = reader(*tables.values()).read(len(tables))
    assert {m.topic: m.value["after"]["origin"] for m in read} == {
        topic: table for table, topic in tables.items()
    }
    assert len(read) == len(tables)
    for topic in tables.values():  # TopicNameStrategy: the subjects follow the topic
        assert registry_get(kafka_stack, f"subjects/{topic}-value/versions") == [1]
        assert registry_get(kafka_stack, f"subjects/{topic}-key/versions") == [1]
    assert p.stop() == 0


@pytest.mark.slow
def test_a_shared_topic_only_on_purpose(
    db: Database,
    pg2sink_proc: Proc,
    kafka_stack: KafkaStack,
    topic_prefix: str,
    reader: Callable[..., Reader],
) -> None:
    conn = db.connect()
    for schema in ("a_b", "a"):
        conn.execute(f"CREATE SCHEMA {schema}")
    conn.execute("CREATE TABLE a_b.c (id int primary key)")
    conn.execute("CREATE TABLE a.b_c (id int primary key)")
    # --topic-map sends both to one topic: accepted
    both = f"{topic_prefix}-both"
    schemas = ("--schema", "a_b", "--schema", "a")
    explicit = (*schemas, "--topic-map", f"a_b.c={both}", "--topic-map", f"a.b_c={both}")
    p = start(pg2sink_proc, kafka_stack, topic_prefix, *explicit, avro=False)
    conn.execute("INSERT INTO a_b.c VALUES (1)")
    conn.execute("INSERT INTO a.b_c VALUES (2)")
    got = reader(both, avro=False).read(2)
    assert {(m.value["namespace"], m.value["name"]) for m in got} == {("a_b", "c"), ("a", "b_c")}
    assert p.stop() == 0
    # by default their topics p.a_b.c and p.a.b_c are one to Kafka: refused, exit 2,
    # before any message of the second table
    accidental = start(pg2sink_proc, kafka_stack, topic_prefix, *schemas, avro=False)
    conn.execute("INSERT INTO a_b.c VALUES (3)")
    conn.execute("INSERT INTO a.b_c VALUES (4)")
    assert accidental.proc is not None and accidental.proc.wait(60) == 2
    err = accidental.stderr().strip().splitlines()
    assert err[-1].startswith("pg2sink: error: tables a_b.c and a.b_c would share a Kafka topic")
    assert "Traceback" not in accidental.stderr()
    first = reader(f"{topic_prefix}.a_b.c", avro=False).read(1)
    assert [m.value["after"] for m in first] == [{"id": 3}]


@pytest.mark.slow
def test_a_topic_kafka_refuses_for_an_existing_one_is_named(
    db: Database, pg2sink_proc: Proc, kafka_stack: KafkaStack, topic_prefix: str
) -> None:
    # a_b.c's topic exists (made by an earlier run, say); this run sees only a.b_c
    create_topic(kafka_stack.bootstrap_servers, f"{topic_prefix}.a_b.c", partitions=1)
    conn = db.connect()
    conn.execute("CREATE SCHEMA a")
    conn.execute("CREATE TABLE a.b_c (id int primary key)")
    p = start(pg2sink_proc, kafka_stack, topic_prefix, "--schema", "a", avro=False)
    conn.execute("INSERT INTO a.b_c VALUES (1)")
    assert p.proc is not None and p.proc.wait(60) == 2
    last = p.stderr().strip().splitlines()[-1]
    assert last.startswith(
        f"pg2sink: error: Kafka topic '{topic_prefix}.a.b_c' cannot be created: it collides "
        f"with the existing topic '{topic_prefix}.a_b.c'"
    ), last
