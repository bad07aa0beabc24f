"""Which implementation encodes rows: the Python reference or the C extension.

psycopg's `_cmodule` pattern (psycopg chooses its C `Transformer` by PSYCOPG_IMPL): the
C code (pg2sink/changelog/_avro_native.c, the Avro encoder, and _rows_native.c, the new-row
reader; built by setup.py when a compiler is there) is a drop-in behind the same interface
as the Python path, and PG2SINK_IMPL, read once
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
from typing import TYPE_CHECKING, Final, NamedTuple

from pg2sink.errors import ConfigError

if TYPE_CHECKING:
    from types import ModuleType

    from pg2sink.changelog._avro_native import RowEncoder

__all__ = ["CHOICES", "IMPL", "ROWS", "ROW_ENCODER", "VARIABLE", "built", "check"]

VARIABLE: Final = "PG2SINK_IMPL"
CHOICES: Final = ("python", "c")
#: the C modules' dotted names (setup.py's Extensions): the Avro encoder, the row reader
_EXTENSIONS: Final = ("pg2sink.changelog._avro_native", "pg2sink.changelog._rows_native")


class _Choice(NamedTuple):
    impl: str | None
    row_encoder: type[RowEncoder] | None
    rows: ModuleType | None
    error: str | None


def built() -> bool:
    """Whether the C extensions are installed (found without importing them)."""
    return all(importlib.util.find_spec(name) is not None for name in _EXTENSIONS)


def _choose(requested: str | None) -> _Choice:
    """The implementation for PG2SINK_IMPL's value, with the C parts when it is "c";
    implementation None with the error's one line when the value cannot run."""
    if requested is not None and requested not in CHOICES:
        why = f"invalid {VARIABLE}={requested!r}: choose one of {', '.join(CHOICES)}"
        return _Choice(None, None, None, why)
    if requested == "python":
        return _Choice("python", None, None, None)
    try:
        from pg2sink.changelog import _rows_native
        from pg2sink.changelog._avro_native import RowEncoder
    except ImportError as e:
        if requested is None:  # no compiler at install: the Python path alone
            return _Choice("python", None, None, None)
        missing = [n for n in _EXTENSIONS if importlib.util.find_spec(n) is None]
        name = missing[0] if missing else (e.name or _EXTENSIONS[0])
        why = "is not built" if missing else f"cannot be loaded ({e})"
        return _Choice(
            None,
            None,
            None,
            f"{VARIABLE}=c but the C extension {name} {why}: reinstall pg2sink where a C "
            f"compiler is found (`make setup` in a checkout), or set {VARIABLE}=python",
        )
    return _Choice("c", RowEncoder, _rows_native, None)


_CHOICE: Final = _choose(os.environ.get(VARIABLE))
#: "python" or "c"; None when PG2SINK_IMPL cannot run (check() says why)
IMPL: Final = _CHOICE.impl
#: the C encoder class, when IMPL is "c"
ROW_ENCODER: Final = _CHOICE.row_encoder
#: the C row reader's module (_rows_native.c), when IMPL is "c"
ROWS: Final = _CHOICE.rows


def check() -> str:
    """The implementation this process runs; ConfigError (one line) for a PG2SINK_IMPL
    that cannot run: an unknown value, or "c" without the extensions."""
    if IMPL is None:
        raise ConfigError(_CHOICE.error or f"invalid {VARIABLE}")
    return IMPL
