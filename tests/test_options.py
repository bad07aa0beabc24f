"""The option generator (pg2sink/options.py): every config field with flag metadata is an
option of the commands that take its class, given as a flag or a PG2SINK_ variable with
the same result, checked the same way, and shown truthfully in `--help`.

In-process parses (no server): the CLI's end-to-end behaviour is tested in test_cli*.py.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pg2sink import cli, options
from pg2sink.config import LogConfig, SecretDsn, SourceConfig, StreamConfig
from pg2sink.errors import ConfigError
from pg2sink.formats.config import FormatConfig
from pg2sink.options import Option, format_duration, parse_duration
from pg2sink.routing.config import RoutingConfig
from pg2sink.sinks import entries

#: every sink's options are options of `pg2sink stream` (sinks/entries.py)
SINK_CONFIGS = tuple(e.config for e in entries.SINKS if e.config is not None)
CLASSES = (SourceConfig, StreamConfig, RoutingConfig, FormatConfig, *SINK_CONFIGS, LogConfig)
#: the fields that are no option: nested configs, and what no user sets (the message
#: sinks' format and formatting come from --format, FormatConfig's)
NOT_OPTIONS = {"source", "sink_config", "routing", "secrets", "format", "formatting"}
#: values a generic text would not pass (a DSN, a slot name, KEY=VALUE settings...)
SAMPLES: dict[str, list[str]] = {
    "dsn": ["host=h dbname=d password=pw"],
    "primary": ["host=p dbname=d password=pw2"],
    "slot": ["slot_x"],
    "producer": ["linger.ms=5", "acks=all"],
    "registry": ["timeout=5", "basic.auth.credentials.source=URL"],
    "topic_map": ["public.a=x", "public.b=y"],
    "import_backoff_factor": ["3"],
    "spark_driver_memory": ["2g"],
    "spark_session_failures": ["5"],
    "kinesis_create_stream": ["2"],
    "format": ["debezium"],  # the one --debezium-schemas goes with
    "nats_duplicate_window": ["10m"],
    "nats_config": [str(Path(__file__).parent / "sinks" / "nats" / "nats-context.json")],
    "wal_retain": ["1h"],
    "bigquery_load_interval": ["2m"],
    "only": ["public.a=insert", "b=update,delete"],
    "exclude_columns": ["public.a.x", "b.y"],
    "mask_columns": ["public.a.x=redact", "b.y=truncate:2"],
}


def stream_options() -> list[Option]:
    return [o for cls in CLASSES for o in options.options_of(cls)]


def sample(opt: Option) -> list[str]:
    """Texts for `opt` whose value differs from the field's default."""
    if opt.field.name in SAMPLES:
        return SAMPLES[opt.field.name]
    if opt.flag.choices:
        return [next(c for c in opt.flag.choices if c != opt.field.default)]
    if opt.flag.parse is parse_duration:
        return ["2m"]
    if opt.flag.repeat:
        return [f"{opt.field.name}1", f"{opt.field.name}2"]
    return [f"x-{opt.field.name}"]


def as_flags(opt: Option) -> list[str]:
    if opt.switch:
        return [opt.name]
    return [arg for text in sample(opt) for arg in (opt.name, text)]


def as_env(opt: Option) -> str:
    return "true" if opt.switch else ",".join(sample(opt))


def parse_stream(argv: list[str]) -> argparse.Namespace:
    args = cli.build_parser().parse_args(["stream", *argv])
    cli._switches_from_env(args)
    return args


def plain(value: Any) -> Any:
    """A config as comparable values (SecretDsn has no equality of its own)."""
    if isinstance(value, SecretDsn):
        return value.reveal()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def configs(args: argparse.Namespace) -> dict[str, Any]:
    """Every config class built from parsed `args`, by class name (each sink's, as the
    CLI builds the chosen one's)."""
    stream = cli._stream_config(args)
    assert stream.sink_config is not None
    built = {"SourceConfig": stream.source, "StreamConfig": stream, "RoutingConfig": stream.routing}
    for cls in SINK_CONFIGS:
        built[cls.__name__] = options.build(cls, args)
    built["FormatConfig"] = options.build(FormatConfig, args)
    # the CLI puts --format's choice in a message sink's config
    sink = stream.sink_config
    chosen = {k: getattr(sink, k) for k in ("format", "formatting") if hasattr(sink, k)}
    plain_sink: Any = built[type(sink).__name__]
    assert dataclasses.replace(plain_sink, **chosen) == sink
    built["LogConfig"] = options.build(LogConfig, args)
    return {name: plain(cfg) for name, cfg in built.items()}


def default(opt: Option) -> Any:
    """The field's default; None for a required field."""
    if opt.field.default_factory is not dataclasses.MISSING:
        return opt.field.default_factory()
    return None if opt.required else opt.field.default


def owner(opt: Option) -> str:
    return next(c.__name__ for c in CLASSES if opt in options.options_of(c))


def squeezed(text: str) -> str:
    """`text` without whitespace: help wraps lines at spaces and after hyphens."""
    return "".join(text.split())


def stream_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["stream", "--help"])
    return squeezed(capsys.readouterr().out)


def test_every_config_field_is_an_option_in_help_with_its_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shown = stream_help(capsys)
    for cls in CLASSES:
        flagged = {o.field.name for o in options.options_of(cls)}
        for f in dataclasses.fields(cls):
            assert f.name in flagged or f.name in NOT_OPTIONS, f"{cls.__name__}.{f.name}"
    for opt in stream_options():
        assert all(name in shown for name in opt.names), opt.name
        # the help text, then the default when there is one, then the variable
        assert squeezed(f"{opt.flag.help}{options._shown_default(opt)} [env: {opt.env}]") in shown


def test_shown_defaults_are_the_fields_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    shown = stream_help(capsys)
    assert squeezed("(default: 10s) [env: PG2SINK_HEARTBEAT_INTERVAL]") in shown
    assert squeezed("(default: 10m) [env: PG2SINK_IMPORT_BACKOFF_MAX]") in shown
    assert squeezed("(default: 2) [env: PG2SINK_IMPORT_BACKOFF_FACTOR]") in shown
    assert squeezed("repeatable (default: public) [env: PG2SINK_SCHEMA]") in shown
    assert squeezed("(default: pg2sink) [env: PG2SINK_TOPIC_PREFIX]") in shown
    for opt in stream_options():
        if opt.flag.parse is parse_duration:
            assert parse_duration(format_duration(default(opt))) == default(opt)


def test_variables_and_names_are_unique() -> None:
    opts = stream_options()
    assert len({o.env for o in opts}) == len(opts)
    assert len({n for o in opts for n in o.names}) == sum(len(o.names) for o in opts)
    assert len({o.field.name for o in opts}) == len(opts)  # the namespace's attributes


def test_flags_and_environment_give_equal_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    opts = stream_options()
    from_flags = configs(parse_stream([arg for o in opts for arg in as_flags(o)]))
    for opt in opts:  # every option reached its field: none kept the default
        assert from_flags[owner(opt)][opt.field.name] != plain(default(opt)), opt.name
    assert from_flags["StreamConfig"]["imports"] is False  # --no-imports
    assert from_flags["StreamConfig"]["heartbeat_interval"] == 120.0
    assert from_flags["KafkaConfig"]["producer"].reveal() == {"linger.ms": "5", "acks": "all"}
    for opt in opts:
        monkeypatch.setenv(opt.env, as_env(opt))
    assert configs(parse_stream([])) == from_flags


def test_a_flag_wins_over_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG2SINK_SLOT", "from_env")
    monkeypatch.setenv("PG2SINK_FLUSH_INTERVAL", "3s")
    monkeypatch.setenv("PG2SINK_NO_IMPORTS", "false")
    stream = cli._stream_config(parse_stream(["--slot", "from_flag", "--no-imports"]))
    assert stream.source.slot == "from_flag" and stream.imports is False
    assert stream.flush_interval == 3.0


@pytest.mark.parametrize(
    "opt", [o for o in stream_options() if not o.switch and not o.flag.repeat], ids=lambda o: o.name
)
def test_every_single_valued_option_given_twice_is_an_error(
    opt: Option, capsys: pytest.CaptureFixture[str]
) -> None:
    [text] = sample(opt)
    with pytest.raises(SystemExit) as exited:
        parse_stream([opt.name, text, opt.name, text])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {'/'.join(opt.names)}: given more than once" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "opt",
    [o for o in stream_options() if o.flag.choices or o.flag.parse not in (None, str.strip)],
    ids=lambda o: o.name,
)
def test_a_variable_is_checked_like_its_flag_and_named(
    opt: Option, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit):
        parse_stream([opt.name, "-1"])
    from_flag = capsys.readouterr().err
    monkeypatch.setenv(opt.env, "-1")
    with pytest.raises(SystemExit):
        parse_stream([])
    assert f"argument {opt.name}: " in from_flag
    assert capsys.readouterr().err == from_flag.replace(" (see ", f" (from {opt.env}) (see ", 1)


@pytest.mark.parametrize("opt", [o for o in stream_options() if o.switch], ids=lambda o: o.name)
def test_a_switch_variable_must_be_a_boolean(opt: Option, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(opt.env, "maybe")
    with pytest.raises(ConfigError, match=f"{opt.env}='maybe' is not a boolean"):
        parse_stream([])


@pytest.mark.parametrize(
    ("command", "absent"),
    [("drop", "--streaming"), ("status", "--sink"), ("migrate", "--table"), ("import", "-T")],
)
def test_other_commands_take_the_source_and_logging_options(
    command: str, absent: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([command, "--help"])
    shown = capsys.readouterr().out
    assert "[env: PG2SINK_SOURCE]" in shown and "[env: PG2SINK_LOG_LEVEL]" in shown
    assert absent not in shown.split("usage:")[1].split("\n\n")[0]  # not in the usage
    assert "--publish-via-partition-root" not in shown
