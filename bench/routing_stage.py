"""The routing stage's cost per Insert (pg2sink/routing/stage.py), on the stream's thread.

Feeds one pgoutput Insert of six text columns to RoutingStage, whose next feed does
nothing, and prints microseconds per message for:

- a table no rule touches (what --only/--mask-column cost every other table: the tag
  check and one dict lookup);
- a table with one column excluded and one masked by hash (the tuple rewritten, one
  HMAC-SHA256);
- the next feed alone (the call the stage adds to).

    .venv/bin/python bench/routing_stage.py [--messages 200000]
"""

from __future__ import annotations

import argparse
import struct
import timeit
from functools import partial

from pg2sink.routing.rules import compile_rules
from pg2sink.routing.stage import RoutingStage

COLUMNS = ["id", "email", "password", "note", "a", "b"]
VALUES = [b"12345", b"ann@example.com", b"secret-pw", b"some note text", b"x" * 20, b"y" * 20]


class _Catalog:
    """The one catalog question the stage asks: the key of a routed table."""

    def primary_key(self, relid: int) -> tuple[str, ...]:
        return ("id",)


def relation(oid: int, name: str) -> bytes:
    """A Relation message of public.<name> with COLUMNS, all text, the first the key."""
    out = b"R" + struct.pack(">I", oid) + b"public\0" + name.encode() + b"\0d"
    out += struct.pack(">H", len(COLUMNS))
    for i, column in enumerate(COLUMNS):
        out += bytes([i == 0]) + column.encode() + b"\0" + struct.pack(">Ii", 25, -1)
    return out


def insert(oid: int) -> bytes:
    """An Insert of VALUES into relation `oid`."""
    out = b"I" + struct.pack(">I", oid) + b"N" + struct.pack(">H", len(VALUES))
    for value in VALUES:
        out += b"t" + struct.pack(">I", len(value)) + value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    n = parser.parse_args().messages
    rules = compile_rules(
        only=["other=insert"],
        exclude_columns=["users.password"],
        mask_columns=["users.email=hash"],
        mask_key="bench",
    )

    def nothing(payload: bytes | memoryview, lsn: int) -> int:
        return 0

    stage = RoutingStage(rules, _Catalog(), lambda: nothing)  # type: ignore[arg-type]
    stage.bind()
    stage.feed(relation(1, "plain"), 0)
    stage.feed(relation(2, "users"), 0)
    for label, payload in [("untouched table", insert(1)), ("masked + excluded", insert(2))]:
        seconds = min(timeit.repeat(partial(stage.feed, payload, 0), number=n, repeat=5)) / n
        print(f"{label}: {seconds * 1e6:.2f} us per Insert")
    plain = insert(1)
    alone = min(timeit.repeat(lambda: nothing(plain, 0), number=n, repeat=5)) / n
    print(f"next feed alone: {alone * 1e6:.2f} us")


if __name__ == "__main__":
    main()
