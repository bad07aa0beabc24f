"""The Kinesis sink's options (--sink=kinesis; docs/sinks/kinesis.md).

Credentials are not options: boto3 finds them the AWS way (AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, AWS_PROFILE or --kinesis-profile, ~/.aws, an instance or task
role), so no secret is ever on a command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pg2sink.errors import ConfigError
from pg2sink.formats.config import Formatting
from pg2sink.options import flag

GROUP = "kinesis sink (--sink=kinesis)"


def _shards(text: str) -> int:
    """A shard count: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"invalid shard count {text!r} (a whole number >= 1)") from None
    if value < 1:
        raise ValueError(f"shard count {text!r} must be at least 1")
    return value


def _text(default: str | None, metavar: str, help: str) -> Any:
    """A one-value text option of this group, stripped of spaces."""
    return flag(default, group=GROUP, help=help, metavar=metavar, parse=str.strip)


@dataclass(frozen=True)
class KinesisConfig:
    """What `--sink=kinesis` needs."""

    kinesis_stream: str = _text(
        "",
        "NAME",
        "the Kinesis data stream every record is put to (it must exist, see "
        "--kinesis-create-stream)",
    )
    kinesis_region: str | None = _text(
        None, "REGION", "AWS region; default: AWS_REGION, AWS_DEFAULT_REGION or the profile's"
    )
    kinesis_endpoint: str | None = _text(
        None,
        "URL",
        "Kinesis API endpoint URL (a VPC endpoint, a local server); default: AWS's for the region",
    )
    kinesis_profile: str | None = _text(
        None,
        "PROFILE",
        "AWS profile of ~/.aws/config and ~/.aws/credentials; default: AWS_PROFILE, else "
        "the default credential chain (environment, profile, instance role)",
    )
    kinesis_create_stream: int | None = flag(
        None,
        group=GROUP,
        help="create the stream with N shards (provisioned mode) when it does not exist",
        metavar="N",
        parse=_shards,
    )
    """Shards of a stream created at start; None: a missing stream is an error."""
    format: str = "json"
    """The message format: the shared --format option's choice (formats/config.py, set by
    the CLI): json or a formats/ encoder's name."""
    formatting: Formatting = field(default_factory=Formatting)
    """What the format's encoder needs beyond its name (set by the CLI)."""

    def check(self) -> None:
        """ConfigError for what can be checked without AWS (the CLI calls it)."""
        if not self.kinesis_stream:
            raise ConfigError("--sink=kinesis needs --kinesis-stream NAME")
        endpoint = self.kinesis_endpoint
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                f"invalid --kinesis-endpoint {endpoint!r}: expected http://HOST[:PORT] "
                "or https://..."
            )
