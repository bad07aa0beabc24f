"""Which implementation encodes rows: the Python reference or the C extension.

psycopg's `_cmodule` pattern (psycopg chooses its C `Transformer` by PSYCOPG_IMPL): the
C code (pg2sink/changelog/_avro_native.c, built by setup.py when a compiler is there)
is a drop-in behind the same interface as the Python path, and PG2SINK_IMPL, read once
when this module is imported, chooses for the whole process:

    PG2SINK_IMPL   implementation
    python         the Python path alone (the reference); the C module is not imported
    c              the C extension; an error if it is not built
    (unset)        c when the extension is built, else python (an install without a
                   compiler), as before the variable existed

Anything else is an error. Nothing is raised here at import, so that importing this
module never ends in a traceback: `check()` raises the error as a ConfigError, which the
CLI prints as one line with exit code 2. The CLI calls it at start for every command,
and avro_native again when it is imported (for a program that uses pg2sink without the CLI).
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Final

from pg2sink.errors import ConfigError

if TYPE_CHECKING:
    from pg2sink.changelog._avro_native import RowEncoder

__all__ = ["CHOICES", "IMPL", "ROW_ENCODER", "VARIABLE", "built", "check"]

VARIABLE: Final = "PG2SINK_IMPL"
CHOICES: Final = ("python", "c")
#: the C module's dotted name (setup.py's Extension)
_EXTENSION: Final = "pg2sink.changelog._avro_native"

_RowEncoderType = type["RowEncoder"]


def built() -> bool:
    """Whether the C extension is installed (found without importing it)."""
    return importlib.util.find_spec(_EXTENSION) is not None


def _choose(requested: str | None) -> tuple[str | None, _RowEncoderType | None, str | None]:
    """(implementation, the C encoder class when it is "c", error) for PG2SINK_IMPL's
    value; implementation None with the error's one line when the value cannot run."""
    if requested is not None and requested not in CHOICES:
        return None, None, f"invalid {VARIABLE}={requested!r}: choose one of {', '.join(CHOICES)}"
    if requested == "python":
        return "python", None, None
    try:
        from pg2sink.changelog._avro_native import RowEncoder
    except ImportError as e:
        if requested is None:
            return "python", None, None  # no compiler at install: the Python path alone
        why = "is not built" if not built() else f"cannot be loaded ({e})"
        return (
            None,
            None,
            f"{VARIABLE}=c but the C extension {_EXTENSION} {why}: reinstall pg2sink "
            f"where a C compiler is found (`make setup` in a checkout), or set {VARIABLE}=python",
        )
    return "c", RowEncoder, None


_CHOICE: Final = _choose(os.environ.get(VARIABLE))
#: "python" or "c"; None when PG2SINK_IMPL cannot run (check() says why)
IMPL: Final = _CHOICE[0]
#: the C encoder class, when IMPL is "c"
ROW_ENCODER: Final = _CHOICE[1]


def check() -> str:
    """The implementation this process runs; ConfigError (one line) for a PG2SINK_IMPL
    that cannot run: an unknown value, or "c" without the extension."""
    if IMPL is None:
        raise ConfigError(_CHOICE[2] or f"invalid {VARIABLE}")
    return IMPL
