"""The Kinesis sink: every record put to one Kinesis data stream, acknowledged in order.

Per record (payload.py): a Kinesis record whose data is the record's JSON line and
whose partition key is the row's primary key (`schema.table` for tables without one, for
TRUNCATE and for Schema records; the prefix for --messages). Schema records are sent
too, so a consumer reading every shard knows each table's columns and types.

Delivery (sender.py): write() queues the entry and returns; a background thread sends
PutRecords of up to 500 records and 5 MiB, one request at a time, in order, and sends
the failed entries of a response again before anything newer. A checkpoint is
acknowledged once every entry written before it is stored (the delivery engine's Marks):
those are the only LSNs the stream confirms to PostgreSQL. Throttling and outages are
retried with backoff while the queue has room; a queue full for the sender's stall wait
raises SinkUnavailableError (the service reconnects, PostgreSQL replays from the last
confirmed LSN: at-least-once). A record over 1 MiB, a missing stream, refused access
raise SinkError and stop the stream with nothing after them confirmed. An outage shows
in GET /status from its first failed request to the first stored one (`report_health`).

Credentials come from boto3's chain (environment, profile, instance role); their
secret parts are registered for redaction, and boto's own loggers, which print
request headers at DEBUG, are kept at WARNING.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    MetadataRetrievalError,
    NoCredentialsError,
    NoRegionError,
    ProfileNotFound,
)
from botocore.exceptions import ConnectionError as NoConnection

from pg2sink.changelog.records import Record, Schema
from pg2sink.errors import ConfigError, SinkError, SinkUnavailableError
from pg2sink.options import add_secret
from pg2sink.sinks.delivery import Marks
from pg2sink.sinks.kinesis.batching import MAX_RECORD_BYTES, Entry
from pg2sink.sinks.kinesis.config import KinesisConfig
from pg2sink.sinks.kinesis.payload import Payload, bounded_key, payload_for
from pg2sink.sinks.kinesis.sender import MAX_QUEUED, STALL_WAIT, Sender

if TYPE_CHECKING:
    from mypy_boto3_kinesis import KinesisClient

    from pg2sink.observability.stats import StreamStats

__all__ = ["KinesisSink"]

log = logging.getLogger(__name__)

#: Longest wait of flush() for the entries written so far, in seconds: short enough
#: that the replication loop keeps answering PostgreSQL while Kinesis is away.
FLUSH_WAIT = 1.0
#: Longest wait at close() for entries not yet stored, then for the sending thread to
#: finish its request (its entries come again after a restart if it has not).
CLOSE_WAIT = 10.0
STOP_WAIT = 5.0
#: How long a stream may stay CREATING (or a created one take to be ACTIVE) at open.
STREAM_WAIT = 120.0
#: Seconds to connect, and to wait for an answer, per request.
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0

#: Loggers of the AWS SDK: at DEBUG they print request headers and bodies.
_SDK_LOGGERS = ("boto3", "botocore", "urllib3", "s3transfer")

#: Error codes of a whole request worth retrying: throughput, throttling, the service's
#: own failures (any HTTP 5xx too), an expired session token (refreshed by the next call).
_RETRYABLE_CODES = frozenset(
    (
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "LimitExceededException",
        "KMSThrottlingException",
        "InternalFailure",
        "InternalFailureException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "RequestTimeout",
        "RequestTimeoutException",
        "ExpiredTokenException",
    )
)


class KinesisSink:
    """Sink putting records to a Kinesis data stream; see the module docstring."""

    #: records are written as pg2sink's JSON (relay: a JSON topic's values, in their JSON
    #: form, can be written here as they are)
    writes_json = True

    def __init__(
        self,
        cfg: KinesisConfig,
        payload: Payload | None = None,
        *,
        max_queued: int = MAX_QUEUED,
        stall_wait: float = STALL_WAIT,
    ) -> None:
        """`max_queued` and `stall_wait`: the sender's bound on queued bytes, and how
        long the queue may stay full (sender.py)."""
        self.cfg = cfg
        self._payload = payload or payload_for(cfg)
        self._limits = (max_queued, stall_wait)
        self._client: KinesisClient | None = None
        self._sender: Sender | None = None
        self._marks = Marks()
        #: the streams outbox messages went to, checked once each
        self._outbox_streams: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        """Make the client, check (or create) the stream, start the sending thread."""
        for name in _SDK_LOGGERS:
            sdk = logging.getLogger(name)
            if sdk.level == logging.NOTSET:
                sdk.setLevel(logging.WARNING)
        self._client = make_client(self.cfg)
        ensure_stream(self._client, self.cfg)
        max_queued, stall_wait = self._limits
        self._sender = Sender(
            self._put, self.cfg.kinesis_stream, max_queued=max_queued, stall_wait=stall_wait
        )
        self._sender.start()
        log.debug("kinesis sink putting to stream %s", self.cfg.kinesis_stream)

    def close(self) -> None:
        """Wait (bounded) for the entries written; what is left is replayed after a
        restart."""
        sender, self._sender = self._sender, None
        if sender is None:
            return
        try:
            sender.send_all()
            sender.wait_accepted(sender.written, CLOSE_WAIT)
        except SinkError:
            pass  # already raised to the stream; nothing more is confirmed
        finally:
            sender.stop(STOP_WAIT)

    # -- records ---------------------------------------------------------------------

    def learn_table(self, schema: Schema) -> None:
        """Key the table's changes by its key columns without sending its Schema record
        (import executors: the driver sent it)."""
        self._payload.learn(schema)

    def write(self, record: Record) -> None:
        """Queue the record's entry; raises the failure that stopped the sender."""
        if record.__class__ is Schema and not self._payload.puts_schemas:
            self._payload.learn(record)  # a --format other than json: changes only
            return
        entry = self._payload.entry(record)
        self._enqueue(entry)

    def _enqueue(self, entry: Entry) -> None:
        sender = self._sender
        if sender is None:
            raise SinkError("the kinesis sink was not opened")
        try:
            sender.enqueue(entry)
        except SinkUnavailableError:
            self._marks.forget()  # the sender dropped its queue: PostgreSQL replays it
            raise

    def publish(
        self,
        destination: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes | None]],
        lsn: int,
    ) -> None:
        """An outbox message (base.PublishesMessages): a record of the Kinesis stream
        the row names (which must exist), its data the payload, its partition key the
        key column's text (the destination when there is none: one shard, in order);
        headers are refused at start (routing/outbox.check_sink)."""
        if destination not in self._outbox_streams:
            if destination != self.cfg.kinesis_stream:
                assert self._client is not None
                check_outbox_stream(self._client, self.cfg, destination)
            self._outbox_streams.add(destination)
        text = key.decode(errors="replace") if key else destination
        own = destination == self.cfg.kinesis_stream  # batched with the sink's records
        entry = Entry(bounded_key(text), value, None if own else destination)
        if entry.size > MAX_RECORD_BYTES:
            raise SinkError(
                f"the outbox message for Kinesis stream {destination!r} at LSN {lsn} is "
                f"{entry.size:,} bytes with its key, over Kinesis's {MAX_RECORD_BYTES:,}"
            )
        self._enqueue(entry)

    def _put(self, entries: Sequence[Entry]) -> Mapping[str, Any]:
        """One PutRecords (the sender's thread): to the entries' stream (one per batch:
        batching.take_batch); errors as Sender.Put says."""
        assert self._client is not None
        stream = entries[0].stream or self.cfg.kinesis_stream
        try:
            return self._client.put_records(
                StreamName=stream,
                Records=[{"Data": e.data, "PartitionKey": e.key} for e in entries],
            )
        except ClientError as e:
            raise _request_error(e, stream) from None
        except (
            NoConnection,
            HTTPClientError,
            CredentialRetrievalError,
            MetadataRetrievalError,
        ) as e:
            raise SinkUnavailableError(f"cannot reach Kinesis at {_where(self.cfg)}: {e}") from None
        except NoCredentialsError:
            raise SinkUnavailableError("AWS credentials are no longer available") from None
        except BotoCoreError as e:
            raise SinkError(f"Kinesis client error: {e}") from None

    def report_health(self, stats: StreamStats) -> None:
        """Tell `stats` when Kinesis stops storing records and when it stores them again
        (GET /status), as the sender finds out."""
        if self._sender is not None:
            self._sender.outages.report_to(stats.sink_outage)

    # -- acknowledgement -------------------------------------------------------------

    def checkpoint(self, lsn: int) -> None:
        if self._sender is not None:
            self._marks.checkpoint(self._sender.written, lsn)

    def start_flush(self) -> None:
        """Ask the sender to put everything written so far (it does not wait)."""
        if self._sender is not None:
            self._sender.send_all()

    def flush(self) -> int | None:
        """Put everything written so far and wait (up to FLUSH_WAIT) until it is stored;
        the highest acknowledged checkpoint."""
        sender = self._sender
        if sender is None:
            return self._marks.acknowledged(0)
        sender.send_all()
        sender.wait_accepted(sender.written, FLUSH_WAIT)
        return self.acknowledged()

    def acknowledged(self) -> int | None:
        sender = self._sender
        return self._marks.acknowledged(sender.accepted() if sender is not None else 0)

    def pending_bytes(self) -> int:
        """Data and partition-key bytes written and not yet stored."""
        return self._sender.pending_bytes() if self._sender is not None else 0


# -- the client and the stream -------------------------------------------------------


def _where(cfg: KinesisConfig) -> str:
    """The endpoint or region requests go to, for messages."""
    return cfg.kinesis_endpoint or f"region {cfg.kinesis_region or '(default)'}"


def make_client(cfg: KinesisConfig) -> KinesisClient:
    """A Kinesis client with the AWS credential chain; ConfigError when no region or no
    credentials are found. The credentials' secret parts are registered for redaction."""
    try:
        session = boto3.session.Session(
            profile_name=cfg.kinesis_profile, region_name=cfg.kinesis_region
        )
        credentials = session.get_credentials()
        if credentials is None:
            raise ConfigError(
                "--sink=kinesis found no AWS credentials: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE (or --kinesis-profile), or run with "
                "an instance or task role"
            )
        frozen = credentials.get_frozen_credentials()
        add_secret(frozen.secret_key)
        add_secret(frozen.token)
        return session.client(
            "kinesis",
            endpoint_url=cfg.kinesis_endpoint,
            config=Config(
                connect_timeout=CONNECT_TIMEOUT,
                read_timeout=READ_TIMEOUT,
                # the sender retries itself, in order, with one log line per outage
                retries={"mode": "standard", "total_max_attempts": 1},
                user_agent_extra="pg2sink",
            ),
        )
    except ProfileNotFound:
        raise ConfigError(f"--kinesis-profile {cfg.kinesis_profile!r} is not in ~/.aws") from None
    except NoRegionError:
        raise ConfigError(
            "--sink=kinesis needs a region: --kinesis-region, AWS_REGION or "
            "AWS_DEFAULT_REGION, or a profile's region"
        ) from None
    except (CredentialRetrievalError, MetadataRetrievalError) as e:
        raise ConfigError(f"--sink=kinesis cannot get AWS credentials: {e}") from None


def ensure_stream(client: KinesisClient, cfg: KinesisConfig) -> None:
    """Wait until the stream can take records; create it with --kinesis-create-stream;
    SinkError (one line) when it is missing, unreachable or refused."""
    name = cfg.kinesis_stream
    deadline = time.monotonic() + STREAM_WAIT
    created = False
    while True:
        status = _stream_status(client, cfg)
        if status is None:
            if cfg.kinesis_create_stream is None or created:
                raise SinkError(
                    f"Kinesis stream {name!r} does not exist ({_where(cfg)}): create it "
                    f"(aws kinesis create-stream --stream-name {name} --shard-count 1) "
                    "or pass --kinesis-create-stream N"
                )
            _create_stream(client, cfg)
            created = True
        elif status in ("ACTIVE", "UPDATING"):
            return
        elif status == "DELETING":
            raise SinkError(f"Kinesis stream {name!r} is being deleted")
        if time.monotonic() > deadline:
            raise SinkError(f"Kinesis stream {name!r} is still {status} after {STREAM_WAIT:.0f}s")
        time.sleep(0.1)


def check_outbox_stream(client: KinesisClient, cfg: KinesisConfig, stream: str) -> None:
    """SinkError (one line) unless `stream`, named by an outbox row, exists (pg2sink
    creates only its own stream)."""
    status = _stream_status(client, cfg, stream)
    if status is None:
        raise SinkError(
            f"the outbox names Kinesis stream {stream!r}, which does not exist "
            f"({_where(cfg)}): create it"
        )
    if status == "DELETING":
        raise SinkError(f"Kinesis stream {stream!r} (named by the outbox) is being deleted")


def _stream_status(
    client: KinesisClient, cfg: KinesisConfig, stream: str | None = None
) -> str | None:
    """The status (CREATING, ACTIVE...) of `stream` (default: the sink's); None when it
    does not exist."""
    stream = stream or cfg.kinesis_stream
    try:
        summary = client.describe_stream_summary(StreamName=stream)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return None
        raise SinkError(f"Kinesis refused to describe stream {stream!r}: {_text(e)}") from None
    except BotoCoreError as e:
        raise SinkError(f"cannot reach Kinesis at {_where(cfg)}: {e}") from None
    return summary["StreamDescriptionSummary"]["StreamStatus"]


def _create_stream(client: KinesisClient, cfg: KinesisConfig) -> None:
    shards = cfg.kinesis_create_stream
    assert shards is not None
    try:
        client.create_stream(StreamName=cfg.kinesis_stream, ShardCount=shards)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise SinkError(
                f"cannot create Kinesis stream {cfg.kinesis_stream!r}: {_text(e)}"
            ) from None
        return  # created meanwhile by another process
    log.info("created Kinesis stream %s with %d shards", cfg.kinesis_stream, shards)


def _text(e: ClientError) -> str:
    """'Code: message' of an AWS error."""
    error = e.response.get("Error", {})
    return f"{error.get('Code', '?')}: {error.get('Message', '')}".rstrip(": ")


def _request_error(e: ClientError, stream: str) -> SinkError:
    """A whole PutRecords refused: retried (SinkUnavailableError) or not (SinkError)."""
    code = e.response.get("Error", {}).get("Code", "")
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    text = f"Kinesis refused PutRecords to stream {stream!r}: {_text(e)}"
    if code in _RETRYABLE_CODES or status >= 500:
        return SinkUnavailableError(text)
    return SinkError(text)
