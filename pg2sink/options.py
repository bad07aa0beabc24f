"""Command-line options generated from the configuration dataclasses.

A field of a config dataclass (config.py) becomes an option by its metadata,
written with `flag(...)`: its help text, `--help` group, names, choices, the
function that parses one value, whether it repeats. Its default is the
field's default, shown in `--help`; its environment variable is
PG2SINK_<NAME> (upper case, dashes as underscores). `add_options` turns the
fields of a class into argparse options, `build` turns the parsed namespace
back into the class, so names, defaults and help live in one place.

How a value reaches a field:

    flag text ─┐                    ┌─ switch: on/off ──────────────┐
               ├─ argparse ─────────┼─ single: parse(text), once ───┼─ build() ─ Config(...)
    PG2SINK_X ─┘  (env = default)   └─ repeat: [text, ...] ─────────┘

An environment value is a string default that argparse converts with the
option's type, so it is checked exactly like the flag and its error names the
variable. A switch variable stays text until `switches_from_env` reads it as a
boolean, on every run of a command that has the switch.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pg2sink import logs
from pg2sink.errors import ConfigError

_META = "pg2sink.flag"


def split_list(raw: str) -> list[str]:
    """A repeatable option's variable: comma-separated values."""
    return [v.strip() for v in raw.split(",") if v.strip()]


#: a comma that starts another KEY=VALUE client setting; any other comma belongs to the
#: value (`bootstrap.servers=a:1,b:2`, a password holding a comma)
_SETTING_START = re.compile(r",(?=\s*[A-Za-z0-9_.-]+=)")


def split_settings(raw: str) -> list[str]:
    """A KEY=VALUE option's variable: one setting per comma that starts a new key."""
    return [v.strip() for v in _SETTING_START.split(raw) if v.strip()]


@dataclasses.dataclass(frozen=True)
class Flag:
    """How one config field is given on the command line (see `flag`)."""

    help: str
    group: str
    names: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None
    show: Callable[[Any], str] = str
    repeat: bool = False
    split: Callable[[str], list[str]] = split_list
    build: Callable[[Any, str], Any] | None = None
    secret: bool = False
    invert: bool = False
    env: str | None = None


def flag(
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    repr: bool = True,
    **options: Any,
) -> Any:
    """A dataclass field that is also an option; `options` are Flag's attributes.

    A bool default makes a switch (`invert`: the switch sets False); `repeat` an
    option given once per value (its variable: a list split by `split`); `parse`
    turns one text into the value, its ValueError being the user's error; `build`
    turns the parsed value into the field's (called with the option's name for
    errors); `secret` marks text never quoted back; `repr` is dataclasses.field's."""
    meta = {_META: Flag(**options)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, repr=repr, metadata=meta)
    return dataclasses.field(default=default, repr=repr, metadata=meta)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'10s', '500ms', '2m', '1h' or a bare number of seconds → seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"invalid duration {text!r} (examples: 10s, 500ms, 2m)")
    seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be greater than zero")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as `parse_duration` reads them, in the largest whole unit: 600 → '10m'."""
    for unit in ("h", "m", "s", "ms"):
        count = seconds / _UNIT_SECONDS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds:g}"


def parse_duration_or_zero(text: str) -> float:
    """A duration (parse_duration), or 0 for none."""
    return 0.0 if text.strip() in ("0", "0s") else parse_duration(text)


def duration(default: float, group: str, help: str) -> Any:
    """A field of seconds given as a duration (10s, 500ms, 2m)."""
    return flag(
        default,
        group=group,
        help=help,
        parse=parse_duration,
        show=format_duration,
        metavar="DURATION",
    )


def factor(text: str) -> float:
    """A backoff factor: a number of at least 1."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"invalid factor {text!r} (a number >= 1)") from None
    if not value >= 1:
        raise ValueError(f"factor {text!r} must be at least 1")
    return value


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


_JVM_MEMORY = re.compile(r"^[1-9]\d*[kmgt]?$", re.IGNORECASE)


def parse_jvm_memory(text: str) -> str:
    """A JVM memory size as -Xmx reads it (512m, 4g; a bare number is bytes)."""
    value = text.strip()
    if not _JVM_MEMORY.match(value):
        raise ValueError(f"invalid memory size {text!r} (examples: 512m, 4g)")
    return value.lower()


@dataclasses.dataclass(frozen=True)
class Option:
    """One config field's option: the field, its Flag and the names derived from it."""

    field: dataclasses.Field[Any]
    flag: Flag
    names: tuple[str, ...]
    env: str

    @property
    def name(self) -> str:
        """The long option name, used in errors (--kafka-config)."""
        return self.names[-1]

    @property
    def switch(self) -> bool:
        """A bool field is an on/off option taking no value."""
        return isinstance(self.field.default, bool)

    @property
    def required(self) -> bool:
        """No default: an option not given is an empty text (`--source` unset: libpq's
        environment)."""
        return (
            self.field.default is dataclasses.MISSING
            and self.field.default_factory is dataclasses.MISSING
        )


def options_of(
    cls: type, *, groups: Iterable[str] | None = None, omit: Iterable[str] = ()
) -> list[Option]:
    """The options of a config class's flagged fields, in field order; `groups` keeps
    only those groups' fields, `omit` drops fields by name."""
    keep = None if groups is None else set(groups)
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_META)
        if spec is None or f.name in omit or (keep is not None and spec.group not in keep):
            continue
        names = spec.names or ("--" + f.name.replace("_", "-"),)
        long = next(n for n in reversed(names) if n.startswith("--"))
        env = spec.env or "PG2SINK_" + long.lstrip("-").upper().replace("-", "_")
        out.append(Option(f, spec, names, env))
    return out


class _Once(argparse.Action):
    """Stores a single-valued option, refusing a second occurrence: with "the last one
    wins", `--source a --source b` once sent pg2sink to the wrong database."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault("_given", set())
        if self.dest in given:
            raise argparse.ArgumentError(self, "given more than once (it takes one value)")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


class _FromEnv(str):
    """A default read from PG2SINK_<NAME>: argparse converts string defaults with the
    option's type, and the type's error then names the variable."""

    variable = ""


def _from_env(variable: str) -> _FromEnv | None:
    """The variable's text, marked with its name for errors; None when unset."""
    raw = os.environ.get(variable)
    if raw is None:
        return None
    value = _FromEnv(raw)
    value.variable = variable
    return value


def _checked(opt: Option) -> Callable[[str], Any]:
    """The option's type, checking `choices` too: argparse checks choices only for
    command-line values, never for a default, so PG2SINK_FORMAT=xml passed unchecked."""
    choices, convert = opt.flag.choices, opt.flag.parse

    def check(text: str) -> Any:
        try:
            if choices is not None and text not in choices:
                raise argparse.ArgumentTypeError(
                    f"invalid choice: {str(text)!r} (choose from {', '.join(choices)})"
                )
            try:
                return convert(str(text)) if convert is not None else str(text)
            except ValueError as e:
                shown = "the text is not shown: it may hold a secret"
                raise argparse.ArgumentTypeError(shown if opt.flag.secret else str(e)) from None
        except argparse.ArgumentTypeError as e:
            if isinstance(text, _FromEnv):
                raise argparse.ArgumentTypeError(f"{e} (from {text.variable})") from None
            raise

    check.__name__ = getattr(convert, "__name__", "value")  # argparse names it in errors
    return check


def _shown_default(opt: Option) -> str:
    """' (default: X)' for `--help`, in the form the option takes; '' for no value."""
    default = opt.field.default
    if opt.switch or default in (None, "", (), dataclasses.MISSING):
        return ""
    if isinstance(default, tuple):
        return f" (default: {', '.join(map(str, default))})"
    return f" (default: {opt.flag.show(default)})"


#: every PG2SINK_ variable an option added to a parser reads (unknown_variables)
_VARIABLES: dict[str, str] = {}
#: every option added to a parser, by long name (a configuration file's keys)
_OPTIONS: dict[str, Option] = {}
#: the values of --config's file, by long name: defaults below the environment's
_FILE: dict[str, tuple[str | list[str], str]] = {}


def file_keys() -> dict[str, tuple[bool, bool, bool]]:
    """(repeatable, switch, secret) of every option added so far, by long name."""
    return {n: (o.flag.repeat, o.switch, o.flag.secret) for n, o in _OPTIONS.items()}


def added_options() -> dict[str, Option]:
    """Every option added to a parser so far, by long name."""
    return dict(_OPTIONS)


def origin(opt: Option, args: argparse.Namespace) -> str:
    """Where an option's parsed value came from: a flag, its variable or the file."""
    if opt.field.name in getattr(args, "_given", ()):
        return "flag"  # a single-valued option given on the command line
    if os.environ.get(opt.env) is not None:
        return opt.env if not (opt.switch or opt.flag.repeat) else f"{opt.env} or a flag"
    if opt.name in _FILE:
        return f"file {_FILE[opt.name][1]}"
    return "flag"


def use_file_values(values: dict[str, tuple[str | list[str], str]]) -> None:
    """The configuration file's values (text, where) for the options added from now on."""
    _FILE.clear()
    _FILE.update(values)


def _from_file(opt: Option) -> _FromEnv | list[str] | None:
    """The option's value in the configuration file, marked with where it is for errors."""
    found = _FILE.get(opt.name)
    if found is None:
        return None
    text, where = found
    if isinstance(text, list):
        return text
    value = _FromEnv(text)
    value.variable = where
    return value


def add_option(group: argparse._ArgumentGroup, opt: Option) -> None:
    """One option: its default is its variable's text, if set (argparse converts it
    like a flag's), else None, which `build` reads as "the field's default"."""
    _VARIABLES[opt.env] = opt.name
    _OPTIONS[opt.name] = opt
    kwargs: dict[str, Any] = {"dest": opt.field.name, "metavar": opt.flag.metavar}
    env_text = _from_env(opt.env)
    in_file = _from_file(opt) if env_text is None else None
    default: Any = env_text if in_file is None else in_file
    if opt.switch:
        # a switch: its variable becomes a boolean in switches_from_env ('false' is off)
        kwargs.update(action="store_const", const=True)
    elif opt.flag.repeat:
        kwargs["action"] = "append"
        if in_file is None:
            default = opt.flag.split(env_text) if env_text else None
        else:
            default = [in_file] if isinstance(in_file, str) else in_file
    else:
        kwargs.update(action=_Once, type=_checked(opt), choices=opt.flag.choices)
    help = f"{opt.flag.help}{_shown_default(opt)} [env: {opt.env}]"
    group.add_argument(*opt.names, default=default, help=help, **kwargs)


def unknown_variables(environ: Mapping[str, str], other: Iterable[str] = ()) -> list[str]:
    """A warning per PG2SINK_ variable that no option added so far (nor `other`, the
    variables read outside the options) reads, naming the closest known one: a typo
    (PG2SINK_SLOTT) would otherwise leave the option at its default in silence."""
    known = {**dict.fromkeys(other, ""), **_VARIABLES}
    lines = []
    for name in sorted(n for n in environ if n.startswith("PG2SINK_") and n not in known):
        # compared without the prefix every name shares, which would make any two close
        close = difflib.get_close_matches(name[8:], [k[8:] for k in known], n=1, cutoff=0.6)
        match = "PG2SINK_" + close[0] if close else ""
        flag = f", {known[match]}" if close and known[match] else ""
        hint = f" (did you mean {match}{flag}?)" if close else ""
        lines.append(f"environment variable {name} is not a pg2sink setting{hint}; it is ignored")
    return lines


def add_options(
    parser: argparse.ArgumentParser, options: Sequence[Option], group_order: Sequence[str]
) -> None:
    """Every option under its `--help` group, the groups in `group_order`."""
    titles = [g for g in group_order if any(o.flag.group == g for o in options)]
    missing = {o.flag.group for o in options} - set(titles)
    if missing:
        raise AssertionError(f"groups not in the order: {sorted(missing)}")
    for title in titles:
        group = parser.add_argument_group(title)
        for opt in options:
            if opt.flag.group == title:
                add_option(group, opt)


def _bool(name: str, raw: str) -> bool:
    """A switch variable's text as a boolean; ConfigError naming `name` for other text."""
    value = raw.strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name}={value!r} is not a boolean (use true or false)")


def switches_from_env(args: argparse.Namespace) -> None:
    """Switch variables to booleans, each checked whether or not the command uses it.
    After parsing only switches still hold a _FromEnv: other options' pass their type."""
    for name, value in vars(args).items():
        if isinstance(value, _FromEnv):
            setattr(args, name, _bool(value.variable, value))


def register_secrets(value: Any) -> None:
    """Redact in logs and errors whatever `value.secrets()` names (a DSN's password, a
    client setting's): called on each built value before anything can fail on it."""
    secrets = getattr(value, "secrets", None)
    if callable(secrets):
        for secret in secrets():
            add_secret(secret)


# Secrets registered for redaction: logs redact them (logs.add_secret), and so does the
# one error line main() prints itself, which does not pass through logging.
_SECRETS: set[str] = set()


def add_secret(secret: str | None) -> None:
    """Redact `secret` from logs and from main()'s error line."""
    if secret:
        _SECRETS.add(secret)
        logs.add_secret(secret)


def redact(text: str) -> str:
    """`text` without any registered secret."""
    for secret in _SECRETS:
        text = text.replace(secret, logs.REDACTED)
    return text


def _value(opt: Option, args: argparse.Namespace) -> Any:
    """The field value of `opt` in parsed `args`; MISSING for the field's default."""
    raw = getattr(args, opt.field.name, None)
    if isinstance(raw, _FromEnv):  # a switch variable not yet read as a boolean
        raw = _bool(raw.variable, raw)
    if raw is None or (opt.flag.repeat and not raw):
        if not opt.required:
            return dataclasses.MISSING
        raw = ""
    if opt.switch:
        return bool(raw) != opt.flag.invert
    if raw == "" and opt.field.default is None:
        return None  # an empty optional text: not set (--fallback-topic '')
    if opt.flag.build is not None:
        return opt.flag.build(raw, opt.name)
    return tuple(raw) if isinstance(raw, list) else raw


def build(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """An instance of config class `cls` from parsed `args`: each flagged field its
    option's value, or its default when the option was given neither as a flag nor in
    the environment; `given` sets the other fields (nested configs)."""
    values = dict(given)
    for opt in options_of(cls):
        value = _value(opt, args)
        if value is not dataclasses.MISSING:
            register_secrets(value)
            values[opt.field.name] = value
    config = cls(**values)
    register_secrets(config)
    return config
