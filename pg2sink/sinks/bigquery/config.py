"""The BigQuery sink's options (--sink=bigquery; docs/sinks/bigquery.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from pg2sink.errors import ConfigError
from pg2sink.options import duration, flag, format_duration, parse_duration_or_zero

GROUP = "bigquery sink (--sink=bigquery)"

# https://cloud.google.com/bigquery/docs/datasets#dataset-naming
_DATASET = re.compile(r"[A-Za-z0-9_]{1,1024}")
# https://cloud.google.com/resource-manager/docs/creating-managing-projects (and the
# domain-scoped form `example.com:project`)
_PROJECT = re.compile(r"([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")


@dataclass(frozen=True)
class BigQueryConfig:
    """Which dataset of which project the tables go to; credentials are Google's own
    (Application Default Credentials, GOOGLE_APPLICATION_CREDENTIALS), never an option."""

    bigquery_project: str = flag(
        "",
        group=GROUP,
        help="Google Cloud project of the dataset (and of the load jobs)",
        metavar="PROJECT",
    )
    bigquery_dataset: str = flag(
        "",
        group=GROUP,
        help="dataset of the raw changelog tables and latest-state views (created when missing)",
        metavar="DATASET",
    )
    bigquery_location: str = flag(
        "",
        group=GROUP,
        help="location of a dataset the sink creates, e.g. EU or us-central1 (default: "
        "BigQuery's, US)",
        metavar="LOCATION",
    )
    bigquery_endpoint: str = flag(
        "",
        group=GROUP,
        help="BigQuery API URL other than Google's (a local server for tests); without "
        "Google credentials it is called anonymously",
        metavar="URL",
    )
    bigquery_retry_deadline: float = duration(
        600.0,
        group=GROUP,
        help="how long the Google client retries a BigQuery request that fails for want of "
        "the server (unreachable, 5xx, rate limits) before the sink logs an outage and "
        "retries the batch itself, with backoff, until BigQuery answers",
    )
    bigquery_load_interval: float = flag(
        90.0,
        group=GROUP,
        help="least time between two batches of changes (each is a load job per table and "
        "one for the state table, and BigQuery allows 1,500 a day per table: 90s makes at "
        "most 960); a batch of 50,000 changes goes at once; 0: no spacing",
        parse=parse_duration_or_zero,
        show=format_duration,
        metavar="DURATION",
    )

    def check(self) -> None:
        """A project and a dataset of BigQuery's forms; an endpoint is an http(s) URL; a
        retry deadline above 0."""
        if not self.bigquery_project or not self.bigquery_dataset:
            raise ConfigError("--sink=bigquery needs --bigquery-project and --bigquery-dataset")
        if not _PROJECT.fullmatch(self.bigquery_project):
            raise ConfigError(f"--bigquery-project {self.bigquery_project!r} is not a project id")
        if not _DATASET.fullmatch(self.bigquery_dataset):
            raise ConfigError(
                f"--bigquery-dataset {self.bigquery_dataset!r}: letters, digits and _ only"
            )
        if self.bigquery_endpoint:
            url = urlsplit(self.bigquery_endpoint)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise ConfigError(
                    f"--bigquery-endpoint {self.bigquery_endpoint!r} is not an http(s) URL"
                )
        if not self.bigquery_retry_deadline > 0:
            raise ConfigError("--bigquery-retry-deadline must be more than 0s")
        if self.bigquery_load_interval < 0:
            raise ConfigError("--bigquery-load-interval must be 0s or more")
