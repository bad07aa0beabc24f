"""PutRecords batches, and what a response says to send again: no I/O here.

The sender (sender.py) takes batches from the head of its queue with `take_batch` and
hands each response to `plan_retry`, which says which entries go again; both are plain
functions over `Entry` values and the response dict boto3 returns, so the rules below
are tested with responses shaped as the AWS API reference documents them
(https://docs.aws.amazon.com/kinesis/latest/APIReference/API_PutRecords.html):

    {"FailedRecordCount": 1,
     "Records": [{"SequenceNumber": "4960...", "ShardId": "shardId-000000000000"},
                 {"ErrorCode": "ProvisionedThroughputExceededException",
                  "ErrorMessage": "Rate exceeded for shard shardId-000000000001 ..."}],
     "EncryptionType": "NONE"}

`Records[i]` answers the request's i-th record: a sequence number when it was stored,
an ErrorCode (ProvisionedThroughputExceededException or InternalFailure; KMS errors on
an encrypted stream) when it was not. A failure does not stop the records after it.

Limits (Kinesis quotas): at most 500 records and 5 MiB a request, data and partition
keys counted; at most 1 MiB a record, its data and partition key counted (a larger one
is refused before it is queued: payload.py); partition keys of 1 to 256 characters.

Order per partition key. Kinesis stores a key's records in the order one shard receives
them, so pg2sink sends one request at a time and sends a request's failed entries again
before anything newer. Within a request a failure cannot hold back the entries after
it: if entry i of key K fails and a later entry j of K is stored, the shard holds j
before i. So j is sent again after i (`plan_retry`): the key's records then read
`... j, i, j`, and the last copy of each record is in order: a consumer keeping the
latest record per key ends with j's, as the database did. That is the one case where
an accepted entry goes again (at-least-once, as after a restart).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pg2sink.errors import SinkError

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_RECORDS",
    "MAX_RECORD_BYTES",
    "MAX_REQUEST_BYTES",
    "Entry",
    "Outcome",
    "plan_retry",
    "take_batch",
]

#: Records in one PutRecords request.
MAX_RECORDS = 500
#: Bytes of one request: every record's data and partition key.
MAX_REQUEST_BYTES = 5 * 1024 * 1024
#: Bytes of one record: its data and partition key.
MAX_RECORD_BYTES = 1024 * 1024
#: Characters of a partition key (at least 1).
MAX_KEY_CHARS = 256

#: Entry error codes that retrying cannot fix: the stream's KMS key or the caller's
#: rights. Any other code (throughput exceeded, an internal failure) is retried.
TERMINAL_CODES = frozenset(
    (
        "AccessDeniedException",
        "KMSAccessDeniedException",
        "KMSDisabledException",
        "KMSInvalidStateException",
        "KMSNotFoundException",
        "KMSOptInRequired",
    )
)

#: First pause after a failed request, and the longest, in seconds (pg2sink.retry, with
#: full jitter: many writers throttled together do not retry together).
BACKOFF_BASE = 0.1
BACKOFF_CAP = 5.0


class Entry:
    """One record to put: its partition key and data, and the stream it goes to when
    that is not the sink's (an outbox message: routing/outbox.py). A slotted class: one
    is made per change, and a frozen dataclass costs several times as much to make."""

    __slots__ = ("data", "key", "size", "stream")

    def __init__(self, key: str, data: bytes, stream: str | None = None) -> None:
        self.key = key
        self.data = data
        self.stream = stream
        #: bytes counted against the limits: the data and the key's UTF-8
        self.size = len(data) + len(key.encode())

    def __repr__(self) -> str:
        return f"Entry({self.key!r}, {len(self.data)} bytes)"


def take_batch(queue: deque[Entry]) -> list[Entry]:
    """Pop the next request's entries from the head of `queue`: as many as fit in
    MAX_RECORDS and MAX_REQUEST_BYTES, all for the stream of the first (a request puts
    to one stream), and always the first (no entry is larger than a request: payload.py
    refuses one above MAX_RECORD_BYTES)."""
    batch: list[Entry] = []
    size = 0
    stream = queue[0].stream if queue else None
    while queue and len(batch) < MAX_RECORDS:
        entry = queue[0]
        if batch and (size + entry.size > MAX_REQUEST_BYTES or entry.stream != stream):
            break
        batch.append(queue.popleft())
        size += entry.size
    return batch


@dataclass(frozen=True)
class Outcome:
    """What one PutRecords response says about the entries sent."""

    again: list[Entry]
    """To send again, in their order: the failed entries, and every entry after a failed
    one of the same partition key (see the module docstring). Empty: all are stored."""
    errors: dict[str, int]
    """Failed entries per ErrorCode."""
    terminal: str | None = None
    """The first failure retrying cannot fix ('code: message'), if any."""

    @property
    def failed(self) -> int:
        """Entries the response reports failed."""
        return sum(self.errors.values())


def plan_retry(sent: Sequence[Entry], response: Mapping[str, Any]) -> Outcome:
    """The Outcome of a PutRecords `response` to the request of `sent`; SinkError when
    the response does not answer each entry."""
    results = response.get("Records")
    if not isinstance(results, list) or len(results) != len(sent):
        got = len(results) if isinstance(results, list) else "no"
        raise SinkError(f"Kinesis answered a PutRecords of {len(sent)} records with {got} results")
    again: list[Entry] = []
    errors: dict[str, int] = {}
    terminal: str | None = None
    held: set[str] = set()  # keys with a failed entry earlier in this request
    for entry, result in zip(sent, results, strict=True):
        code = result.get("ErrorCode")
        if code:
            errors[code] = errors.get(code, 0) + 1
            if terminal is None and code in TERMINAL_CODES:
                terminal = f"{code}: {result.get('ErrorMessage', '')}".rstrip(": ")
            held.add(entry.key)
            again.append(entry)
        elif entry.key in held:
            again.append(entry)  # stored ahead of an earlier failed entry of its key
    return Outcome(again, errors, terminal)
