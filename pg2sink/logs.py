"""Logging set-up: text or JSON lines on stderr, with secrets redacted.

Modules log with `logging.getLogger(__name__)` and lazy `%s` arguments; this
module only decides how the lines look and makes sure that no registered
secret (a password) can reach the output, whatever a message interpolates.

In a process running several pipelines, a line logged in a pipeline's thread names the
pipeline (`PIPELINE`, set by pg2sink/pipelines.py): `pipeline NAME: ` before the text, a
`pipeline` field in JSON.
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from typing import Any

import orjson

REDACTED = "***"

# Attributes every LogRecord has; anything else was passed with `extra=` and
# becomes a field of the JSON line.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime"}
)


#: the pipeline whose thread logs (None: the process's own lines, or one pipeline alone)
PIPELINE: ContextVar[str | None] = ContextVar("pg2sink_pipeline", default=None)


class PipelineFilter(logging.Filter):
    """Names the logging thread's pipeline: a `pipeline` attribute (a JSON field), and
    with `prefix` the same before the text."""

    def __init__(self, prefix: bool) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        name = PIPELINE.get()
        if name is not None and "pipeline" not in vars(record):
            vars(record)["pipeline"] = name  # a field of its own: JsonFormatter shows it
            if self.prefix:
                record.msg = f"pipeline {name}: {record.getMessage()}"
                record.args = None
        return True


class RedactingFilter(logging.Filter):
    """Replaces every registered secret in the rendered message and fields."""

    def __init__(self, secrets: set[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def _scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret and secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            record.msg = self._scrub(record.getMessage())
            record.args = None
            if record.exc_info and record.exc_info[1] is not None:
                record.exc_text = self._scrub(logging.Formatter().formatException(record.exc_info))
                record.exc_info = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event and extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return orjson.dumps(out, default=str).decode()


_secrets: set[str] = set()
_filter = RedactingFilter(_secrets)


def add_secret(secret: str | None) -> None:
    """Register a string that must never appear in log output."""
    if secret:
        _secrets.add(secret)


def setup(level: str = "info", fmt: str = "text") -> None:
    """Configure the root logger once for the process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(PipelineFilter(prefix=fmt != "json"))
    handler.addFilter(_filter)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        formatter = logging.Formatter(
            "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S",
        )
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
