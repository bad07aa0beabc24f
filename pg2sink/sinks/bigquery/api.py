"""The Google client of the BigQuery sink and what its answers mean: the client
(credentials, --bigquery-endpoint), a request's error as SinkError or, when the server is
away, SinkUnavailableError (the batch is retried: sinks/warehouse/commits.py), and the sink's
columns (schema.Field) to and from BigQuery's SchemaField.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.api_core import exceptions as google_errors
from google.cloud import bigquery

from pg2sink.errors import SinkError, SinkUnavailableError
from pg2sink.retry import retries_within
from pg2sink.sinks.bigquery.config import BigQueryConfig
from pg2sink.sinks.bigquery.schema import Field

__all__ = [
    "QUOTA_HINT",
    "QUOTA_REASON",
    "client",
    "field_of",
    "one_line",
    "reason_of",
    "request_error",
    "schema_fields",
    "upload_retries",
]

#: the reasons of a 4xx by which BigQuery says "later" (rate limits, its own trouble):
#: its client retries them (google.cloud.bigquery.retry), and so does the sink, as an outage
TRANSIENT_REASONS = frozenset({"rateLimitExceeded", "backendError", "internalError", "badGateway"})
#: the reason of a daily quota spent: retried, every attempt would spend more of it
QUOTA_REASON = "quotaExceeded"
QUOTA_HINT = (
    "BigQuery allows a table 1,500 load jobs a day: a longer --bigquery-load-interval makes fewer"
)

#: google-resumable-media's waits between a load upload's attempts: 1 s, doubling, at
#: most 64 s (its RetryStrategy)
_UPLOAD_FIRST_WAIT = 1.0
_UPLOAD_MAX_WAIT = 64.0


def client(config: BigQueryConfig) -> bigquery.Client:
    """A client of the project: Google's default credentials (ADC,
    GOOGLE_APPLICATION_CREDENTIALS); with --bigquery-endpoint and none found, anonymous."""
    import google.auth
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials, Credentials

    options = None
    credentials: Credentials | None = None
    if config.bigquery_endpoint:
        options = ClientOptions(api_endpoint=config.bigquery_endpoint)
        try:
            google.auth.default()
        except google.auth.exceptions.DefaultCredentialsError:
            credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    try:
        return bigquery.Client(
            project=config.bigquery_project, credentials=credentials, client_options=options
        )
    except google.auth.exceptions.DefaultCredentialsError as e:
        raise SinkError(f"--sink=bigquery: no Google credentials: {one_line(e)}") from None


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:500]


def request_error(what: str, error: Exception) -> SinkError:
    """`error` of the request `what`: SinkUnavailableError when the server is unreachable,
    answers 5xx (501, not implemented, is an answer) or limits the rate, also once the
    client's retries of that ran out (BigQuery says rate limits with 403 and a reason,
    TRANSIENT_REASONS); else BigQuery's refusal, a SinkError (a spent quota says how to
    spend less)."""
    cause = error.cause if isinstance(error, google_errors.RetryError) else error
    reason = reason_of(cause)
    transient = (
        isinstance(cause, (google_errors.ServerError, google_errors.TooManyRequests, OSError))
        and not isinstance(cause, google_errors.MethodNotImplemented)
    ) or reason in TRANSIENT_REASONS
    kind = SinkUnavailableError if transient or cause is None else SinkError
    hint = f" ({QUOTA_HINT})" if reason == QUOTA_REASON else ""
    return kind(f"bigquery: {what}: {one_line(error)}{hint}")


def reason_of(error: BaseException | None) -> str | None:
    """The reason BigQuery gave an error (`errors[0].reason`, as its client reads it)."""
    errors = getattr(error, "errors", None)
    try:
        reason = errors[0]["reason"]  # type: ignore[index]
    except (IndexError, KeyError, TypeError):
        return None
    return reason if isinstance(reason, str) else None


def upload_retries(deadline: float) -> int:
    """How many times a load's upload may be retried for its waits to fit in `deadline`
    seconds. The upload takes no `retry`: left at the client's default (6 retries, 63 s
    of waits), an upload that meets a server gone away would hold the batch past
    --bigquery-retry-deadline, and the outage would go unreported for a minute."""
    return retries_within(deadline, _UPLOAD_FIRST_WAIT, _UPLOAD_MAX_WAIT)


def field_of(field: bigquery.SchemaField) -> Field:
    """A raw table's column as BigQuery has it."""
    precision, scale = field.precision, field.scale
    return Field(
        field.name,
        field.field_type,
        field.mode == "REPEATED",
        None if precision is None else int(precision),
        None if scale is None else int(scale),
    )


def schema_fields(fields: Sequence[Field]) -> list[bigquery.SchemaField]:
    out = []
    for f in fields:
        mode = "REPEATED" if f.repeated else "NULLABLE"
        if f.precision is None or f.scale is None:
            out.append(bigquery.SchemaField(f.name, f.type, mode=mode))
        else:
            out.append(
                bigquery.SchemaField(
                    f.name, f.type, mode=mode, precision=f.precision, scale=f.scale
                )
            )
    return out
