"""The file sink's options (--sink=file, the default; --decode-only writes there too)."""

from __future__ import annotations

from dataclasses import dataclass

from pg2sink.options import flag

GROUP = "file sink (--sink=file; --decode-only)"


@dataclass(frozen=True)
class FileConfig:
    """Where the JSON lines go."""

    file_path: str = flag(
        "-",
        group=GROUP,
        help="JSON-lines file to append to; '-' is standard output",
        metavar="PATH",
    )
