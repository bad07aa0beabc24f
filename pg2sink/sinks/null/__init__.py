"""The null sink (--sink=null): accepts, acknowledges and discards every record.

For measuring the source side (decoding, the replication loop) without any sink's cost,
and for dry runs; psql-streamer's stub sink. It takes no options.

sink.py     NullSink: counts the records and acknowledges each checkpoint at once
imports.py  NullImportTarget: imports decode their rows, count and discard them
"""

from __future__ import annotations

from pg2sink.sinks.null.imports import NullImportTarget
from pg2sink.sinks.null.sink import NullSink

__all__ = ["NullImportTarget", "NullSink"]
