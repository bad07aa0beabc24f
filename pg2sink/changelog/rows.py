"""Decode the column values of a pgoutput tuple into a dict of typed values.

This is the innermost loop of pg2sink: it runs once per column of every changed row. The
decoders come from `pg2sink.changelog.typemap.codec_for`; a `RowDecoder` is built once per
Relation message and reused for every row of that relation.

For speed, each RowDecoder compiles a function specialised to its relation: the loop over
columns is unrolled into one dict display (`{n0: d0(v0) if ..., n1: ...}`), which removes
the per-column loop, zip and store overhead (`make bench-stream`). Names and decoders
reach the generated code as bound constants, never as source text, so no identifier can
change what the code does. Any failure falls back to the plain loop, which finds the
offending column and raises DecodeError naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pg2sink.changelog.typemap import RowColumn
from pg2sink.errors import DecodeError
from pg2sink.logical.messages import UNCHANGED_TOAST, UnchangedToast

__all__ = ["RowDecoder"]

# How much of an undecodable value an error message shows.
_PREVIEW_BYTES = 40


def _not_text(value: object) -> object:
    """The value of a column that is neither text bytes, NULL nor the UNCHANGED_TOAST
    singleton: another UnchangedToast instance passes, anything else is an error."""
    if isinstance(value, UnchangedToast):
        return value
    raise TypeError(f"expected text-format bytes, got {type(value).__name__}")


class RowDecoder:
    """Turns the values of one relation's tuples into {column name: value}.

    A value is the text output of its type as bytes (decoded by that column's decoder),
    None for NULL (stays None) or UNCHANGED_TOAST (kept as is: whether to fill it in from
    an earlier image or to emit a marker is the caller's decision). Any other value, such as
    a binary-format one, and any value its decoder rejects raise DecodeError naming the
    column: nothing is dropped silently.
    """

    __slots__ = ("_columns", "_decoders", "_names", "_pg_types", "decode")

    def __init__(
        self,
        names: Sequence[str],
        decoders: Sequence[Callable[[bytes], object]],
        *,
        pg_types: Sequence[str] | None = None,
    ) -> None:
        """`pg_types` (e.g. the codecs' pg_type) only make error messages more precise."""
        if len(names) != len(decoders):
            raise ValueError(f"{len(names)} column names but {len(decoders)} decoders")
        if pg_types is not None and len(pg_types) != len(names):
            raise ValueError(f"{len(names)} column names but {len(pg_types)} type names")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate column names in {list(names)!r}")
        self._names = tuple(names)
        self._decoders = tuple(decoders)
        self._pg_types = tuple(pg_types) if pg_types is not None else None
        # zipped once here rather than for every row
        self._columns = tuple(zip(self._names, self._decoders, strict=True))
        #: decode(values) -> {column name: value}; see the module docstring
        self.decode: Callable[[Sequence[object]], dict[str, object]] = self._compile()

    def _compile(self) -> Callable[[Sequence[object]], dict[str, object]]:
        n = len(self._names)
        env: dict[str, object] = {"_slow": self._decode_slow, "_U": UNCHANGED_TOAST}
        items = []
        for i, (name, decode) in enumerate(self._columns):
            env[f"n{i}"] = name
            env[f"d{i}"] = decode
            # text → decoder; NULL and the toast singleton as they are; else the slow path
            items.append(
                f"n{i}: d{i}(v{i}) if v{i}.__class__ is bytes"
                f" else v{i} if v{i} is None or v{i} is _U else _slow(values)"
            )
        unpack = "".join(f"v{i}, " for i in range(n))
        source = (
            "def decode(values):\n"
            "    try:\n"
            f"        {unpack or '()'} = values\n"
            f"        return {{{', '.join(items)}}}\n"
            "    except Exception:\n"
            "        return _slow(values)\n"
        )
        exec(compile(source, f"<RowDecoder {len(self._names)} columns>", "exec"), env)
        return env["decode"]  # type: ignore[return-value]

    @classmethod
    def for_columns(cls, columns: Sequence[RowColumn]) -> RowDecoder:
        """A decoder for the columns of `avro_row_schema`, with type names for errors."""
        return cls(
            [c.name for c in columns],
            [c.codec.decode for c in columns],
            pg_types=[c.codec.pg_type for c in columns],
        )

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in tuple order."""
        return self._names

    def _decode_slow(self, values: Sequence[object]) -> dict[str, object]:
        """{column name: decoded value} for one tuple, in column order; the reference
        implementation, used when the compiled one meets anything unusual."""
        if len(values) != len(self._columns):
            raise DecodeError(
                f"tuple has {len(values)} values but the relation has {len(self._columns)} columns"
            )
        out: dict[str, object] = {}
        try:
            # A plain loop beats a comprehension here (no nested frame); checking the class
            # beats isinstance; NULL and the toast marker are tested inline, without a call.
            for (name, decode), value in zip(self._columns, values):  # noqa: B905
                if value.__class__ is bytes:
                    out[name] = decode(value)
                elif value is None or value is UNCHANGED_TOAST:
                    out[name] = value
                else:
                    out[name] = _not_text(value)
        except Exception as exc:
            # Columns are added to `out` in order once decoded, so the one that failed is
            # the next: len(out). (Names are unique, see __init__.)
            index = len(out)
            raise DecodeError(
                f"column {self._describe(index)}: {_preview(values[index])}: {exc!r}"
            ) from exc
        return out

    def _describe(self, index: int) -> str:
        name = repr(self._names[index])
        if self._pg_types is None:
            return name
        return f"{name} of type {self._pg_types[index]}"


def _preview(value: object) -> str:
    if isinstance(value, bytes):
        if len(value) > _PREVIEW_BYTES:
            return f"cannot decode {value[:_PREVIEW_BYTES]!r}... ({len(value)} bytes)"
        return f"cannot decode {value!r}"
    return f"unexpected {type(value).__name__} value"
