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
    file_transactions: bool = flag(
        False,
        group=GROUP,
        help='a {"kind":"transaction","status":"BEGIN"...} line before each transaction\'s '
        "lines and an END line (its commit LSN and event counts) after them",
        names=("--transactions",),
    )
