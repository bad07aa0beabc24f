"""Secrets in malformed input never reach the output (issue #11, item 12).

Each case feeds a password the way a user gets it wrong (a comma in an environment
list, a space in a DSN, a URI the parser rejects, a shell that split the DSN) through
flags and the environment, and greps everything the process printed.
"""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

SECRET = "Hunter2xyz"


def assert_hidden(*args: str, env: dict[str, str] | None = None) -> str:
    """Run the CLI; it must fail with one line and print the secret nowhere."""
    res = run_cli(*args, env=env)
    printed = res.stdout + res.stderr
    assert SECRET not in printed, printed
    assert res.returncode == 2, printed
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    return res.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PG2SINK_KAFKA_CONFIG", f"sasl.password=ab,{SECRET}"),
        ("PG2SINK_KAFKA_CONFIG", f"linger.ms=5,sasl.password=ab,{SECRET},acks=all"),
        ("PG2SINK_SCHEMA_REGISTRY_CONFIG", f"basic.auth.user.info=me:ab,{SECRET}"),
        ("PG2SINK_KAFKA_CONFIG", f"{SECRET}"),
        ("PG2SINK_KAFKA_CONFIG", f"linger.ms=5,{SECRET}"),
        ("PG2SINK_KAFKA_CONFIG", f"bad key {SECRET}=1"),
    ],
)
def test_client_settings_from_the_environment(variable: str, value: str) -> None:
    # the broker is missing: with well-formed settings the error is about it
    err = assert_hidden("--sink=kafka", "--format=json", env={variable: value})
    if "=ab," in value:
        # a comma inside a value is part of it, not the start of another setting
        assert "needs --kafka-bootstrap-servers" in err


@pytest.mark.parametrize(
    "value",
    [SECRET, f"bad key {SECRET}=1", f"{SECRET} sasl.password=x", f"=sasl.password{SECRET}"],
)
def test_client_settings_from_flags(value: str) -> None:
    for flag in ("--kafka-config", "--schema-registry-config"):
        err = assert_hidden("--sink=kafka", "--format=json", flag, value)
        assert f"invalid {flag}" in err


def test_a_comma_separated_environment_list_keeps_values_with_commas() -> None:
    """bootstrap.servers=a:1,b:2 is one setting: the broker list is not a second setting."""
    res = run_cli(
        "--sink=kafka",
        "--format=json",
        "--metrics-address=off",
        env={
            "PG2SINK_KAFKA_CONFIG": "bootstrap.servers=127.0.0.1:1,127.0.0.1:2,linger.ms=5",
            "PG2SINK_SOURCE": "host=127.0.0.1 port=1 connect_timeout=1",
        },
    )
    assert res.returncode == 2, res.stderr
    assert "invalid --kafka-config" not in res.stderr
    assert "cannot connect to PostgreSQL" in res.stderr


@pytest.mark.parametrize(
    "dsn",
    [
        f"host=127.0.0.1 port=1 password=ab {SECRET}",
        f"host=127.0.0.1 port=1 password=ab {SECRET}=x",
        f"host=127.0.0.1 port=1 password='ab {SECRET}",
        f"postgresql://u:ab{SECRET}%zz@127.0.0.1:1/db",
        f"postgresql://u:ab{SECRET}@[::1:1/db",
        f"postgresql://u:ab{SECRET}@127.0.0.1:1/db?sslmode=what",
        f"host=127.0.0.1 port=1 password=ab{SECRET} sslmode=what",
    ],
)
def test_malformed_dsn(dsn: str) -> None:
    for command in ("stream", "status", "drop", "migrate"):
        err = assert_hidden(command, "--source", dsn)
        assert "--source" in err or "cannot connect" in err
        assert_hidden(command, env={"PG2SINK_SOURCE": dsn})


def test_a_dsn_split_by_the_shell() -> None:
    """`--source host=x password=ab Hunter2xyz` unquoted: argparse must not echo the words."""
    err = assert_hidden("--source", "host=127.0.0.1", "password=ab", SECRET)
    assert "unexpected" in err and "quote" in err
    err = assert_hidden("--kafka-config", "sasl.password=ab", SECRET, "--sink=kafka")
    assert "unexpected" in err


def test_the_client_key_passphrase_is_a_secret_too() -> None:
    """sslpassword (libpq's passphrase of sslkey) was shown by 'cannot connect' errors."""
    err = assert_hidden("--source", f"host=127.0.0.1 port=1 connect_timeout=1 sslpassword={SECRET}")
    assert "cannot connect to PostgreSQL" in err and "port=1" in err


def test_the_key_of_a_bad_dsn_setting_is_named() -> None:
    err = assert_hidden("--source", f"host=127.0.0.1 port=1 nosuchkey={SECRET}")
    assert "invalid --source connection string" in err
    err = assert_hidden("--source", f"host=127.0.0.1 port=1 password=ab {SECRET}")
    assert "single quotes" in err


@pytest.mark.parametrize(
    "arg",
    [f"--sou=host=x password={SECRET}", f"--kafka-conf=sasl.password={SECRET}", f"--s={SECRET}"],
)
def test_abbreviated_flags_are_refused_without_their_value(arg: str) -> None:
    """argparse's abbreviations are off: `--s=VALUE` (ambiguous) echoed VALUE in its error."""
    err = assert_hidden(arg)
    assert "unrecognized arguments" in err
