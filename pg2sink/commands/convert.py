"""`pg2sink config convert FILE [--output-dir DIR]`: psql-streamer's TOML or
wal-listener's config.yml as pg2sink configurations (pg2sink/convert/,
docs/configuration.md "Moving from psql-streamer / wal-listener")."""

from __future__ import annotations

from pathlib import Path

from pg2sink.convert import convert_file, render, render_all
from pg2sink.errors import ConfigError

__all__ = ["convert"]


def convert(path: str, output_dir: str | None) -> int:
    """Print the configurations converted from `path`, or write each to
    `output_dir/NAME.toml` and print the files' names."""
    conversion = convert_file(path)
    if output_dir is None:
        print(render_all(conversion), end="")
        return 0
    if not conversion.documents:
        raise ConfigError(f"{path}: nothing to convert: {'; '.join(conversion.notes)}")
    directory = Path(output_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for document in conversion.documents:
            target = directory / f"{document.name}.toml"
            target.write_text(render(conversion, document), encoding="utf-8")
            print(target)
    except OSError as e:
        raise ConfigError(f"--output-dir {output_dir}: {e.strerror}") from None
    return 0
