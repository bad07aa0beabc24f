"""RoutingConfig: the options of routing and filtering (docs/routing.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pg2sink.options import flag
from pg2sink.routing.masking import Mask
from pg2sink.routing.outbox import compile_outbox
from pg2sink.routing.rules import Rules, compile_rules

#: a comma that starts another TABLE=ACTIONS (the next '=' comes before the next comma)
_RULE_START = re.compile(r",(?=[^,]*=)")


def split_rules(raw: str) -> list[str]:
    """PG2SINK_ONLY: `public.a=insert,update,public.b=delete` is two values."""
    return [v.strip() for v in _RULE_START.split(raw) if v.strip()]


#: their `--help` group (config.Group.ROUTING)
GROUP = "routing and filtering (docs/routing.md)"


@dataclass(frozen=True)
class RoutingConfig:
    """Which changes and columns reach the sink."""

    only: tuple[str, ...] = flag(
        (),
        group=GROUP,
        help="pass only these actions (insert, update, delete, truncate) of the tables "
        "matching the psql pattern, e.g. 'public.users=insert,update'; tables no --only "
        "matches pass everything; repeatable",
        metavar="TABLE=ACTIONS",
        repeat=True,
        split=split_rules,
    )
    """`TABLE-PATTERN=ACTION[,ACTION...]` values (rules.compile_rules)."""
    exclude_columns: tuple[str, ...] = flag(
        (),
        group=GROUP,
        help="leave out the columns matching [SCHEMA.]TABLE.COLUMN (psql patterns) from "
        "Schema records, changes and imports; never a key column; repeatable",
        names=("--exclude-column",),
        metavar="COLUMN",
        repeat=True,
    )
    mask_columns: tuple[str, ...] = flag(
        (),
        group=GROUP,
        help="mask the columns matching [SCHEMA.]TABLE.COLUMN: =hash (HMAC-SHA256 with "
        "--mask-key, hex; the default), =redact or =truncate:N, before any sink and in "
        "imports' SELECT; the column becomes text; repeatable",
        names=("--mask-column",),
        metavar="COLUMN[=MASK]",
        repeat=True,
    )
    mask_key: str | None = flag(
        None,
        group=GROUP,
        help="the secret key of --mask-column's hash mask (never logged or shown)",
        metavar="SECRET",
        secret=True,
        repr=False,
    )

    outbox: tuple[str, ...] = flag(
        (),
        group=GROUP,
        help="tables matching this psql pattern are outboxes (pglsn): each INSERT becomes "
        "one message to the topic its --outbox-topic-column names, its value the "
        "--outbox-payload-column exactly; updates, deletes and truncates are ignored; "
        "--sink kafka or nats (docs/routing.md); repeatable",
        metavar="TABLE",
        repeat=True,
    )
    outbox_topic_column: str = flag(
        "topic", group=GROUP, help="the outbox column naming the destination", metavar="COLUMN"
    )
    outbox_payload_column: str = flag(
        "payload",
        group=GROUP,
        help="the outbox column whose value is the message (json, jsonb, text: its text; "
        "bytea: its bytes)",
        metavar="COLUMN",
    )
    outbox_key_column: str | None = flag(
        None,
        group=GROUP,
        help="the outbox column whose text is the message key (default: no key)",
        metavar="COLUMN",
    )

    outbox_headers_column: str | None = flag(
        None,
        group=GROUP,
        help="the outbox json/jsonb column whose object's members are the message's "
        "headers (Kafka; default: none but lsn)",
        metavar="COLUMN",
    )

    strict_routing: bool = flag(
        False,
        group=GROUP,
        help="stop (exit 2) when an --only, --exclude-column, --mask-column or --outbox "
        "rule matches no published table or column, at start or any later reconcile, "
        "instead of a WARNING each time",
    )

    def __post_init__(self) -> None:
        self.rules()  # a value that does not parse is the user's error at start

    def rules(self) -> Rules:
        """The compiled rules."""
        return compile_rules(
            self.only,
            self.exclude_columns,
            self.mask_columns,
            self.mask_key,
            compile_outbox(
                self.outbox,
                self.outbox_topic_column,
                self.outbox_payload_column,
                self.outbox_key_column,
                self.outbox_headers_column,
            ),
        )

    def secrets(self) -> tuple[str, ...]:
        """What logs and errors must never show (options.register_secrets)."""
        if not self.mask_key:
            return ()
        # the padded keys of imports' SQL HMAC are as good as the key (masking.Mask.pads)
        pads = Mask("hash", key=self.mask_key.encode()).pads()
        return (self.mask_key, *(p.hex() for p in pads))
