"""`--config FILE` (pg2sink/configfile.py) and `pg2sink config check|show`
(commands/config.py): keys from the options, flags and variables over the file, one-line
errors naming the file, line and key, secrets from the environment or files and never
shown; and a real stream configured by the file alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from pg2sink.configfile import config_path, load
from pg2sink.errors import ConfigError
from tests.conftest import Database, Pg2Sink, clean_env, read_jsonl, run_cli, wait_for

SECRET = "s3cr3t-never-shown"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pg2sink.toml"
    path.write_text(text)
    return str(path)


def test_check_accepts_a_good_file_and_show_says_where_each_setting_comes_from(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        'source = "host=/nowhere dbname=x password=${PW}"\n'
        'slot = "from_file"\n'
        'file-path = "/tmp/x.jsonl"\n'
        'exclude_column = ["public.users.password"]\n'
        "messages = true\n"
        "flush_interval = 2\n",
    )
    env = {"PW": SECRET}
    done = run_cli("config", "check", path, env=env)
    assert (done.returncode, done.stdout.strip()) == (0, f"{path}: ok"), done.stderr
    shown = run_cli(
        "config", "show", "--config", path, "--flush-interval", "3s",
        env={**env, "PG2SINK_SLOT": "from_env"},
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = set(shown.stdout.splitlines())
    assert 'slot = "from_env"  # PG2SINK_SLOT' in lines  # the variable wins over the file
    assert "flush_interval = 3.0  # flag" in lines  # the flag wins over the file
    assert f'exclude_column = ["public.users.password"]  # file {path}:4: exclude_column' in lines
    assert f"messages = true  # file {path}:5: messages" in lines
    assert f"source = ***  # file {path}:1: source" in lines
    assert SECRET not in shown.stdout + shown.stderr


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('slot = "s"\nslott = "x"\n', ":2: slott: unknown key (did you mean slot?)"),
        ('slot = ["a"]\n', ":1: slot: expected a string or a number, got list"),
        ('messages = "yes"\n', ":1: messages: expected true or false, got str"),
        ('flush_interval = "abc"\n', "invalid duration 'abc'"),
        ('sink = "nope"\n', "(from {path}:1: sink)"),
        ('source = "host=x password=${NOT_SET_ANYWHERE}"\n', ":1: source: ${NOT_SET_ANYWHERE}"),
        ("slot = \n", "not TOML"),
        ('mask_key_file = "/nonexistent/key"\n', ":1: mask_key_file: cannot read /nonexistent"),
        ('slot_file = "/etc/hostname"\n', "slot_file: unknown key"),  # slot is no secret
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_line_and_key(
    tmp_path: Path, text: str, words: str
) -> None:
    path = write(tmp_path, text)
    done = run_cli("config", "check", path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert words.replace("{path}", path) in done.stderr and path in done.stderr


def test_secrets_come_from_files_and_are_never_printed(tmp_path: Path) -> None:
    key = tmp_path / "mask.key"
    key.write_text(SECRET + "\n")
    password = tmp_path / "pg.password"
    password.write_text("pw-" + SECRET)
    path = write(
        tmp_path,
        f'mask_key_file = "{key}"\npassword_file = "{password}"\n'
        'mask_column = ["public.users.email"]\n',
    )
    options = {"--mask-key": (False, False, True), "--mask-column": (True, False, False)}
    settings = load(path, options, environ={})
    assert settings.values["--mask-key"].text == SECRET
    assert settings.password == "pw-" + SECRET
    assert {SECRET, "pw-" + SECRET} <= set(settings.secrets)
    shown = run_cli("config", "show", "--config", path)
    assert shown.returncode == 0, shown.stderr
    assert "mask_key = ***" in shown.stdout
    assert SECRET not in shown.stdout + shown.stderr
    with pytest.raises(ConfigError, match="unknown key"):
        load(write(tmp_path, 'mask_key_fil = "x"\n'), options, environ={})


def test_the_path_comes_from_the_flag_or_its_variable() -> None:
    assert config_path(["stream", "--config", "a.toml"], {}) == "a.toml"
    assert config_path(["stream", "--config=b.toml"], {"PG2SINK_CONFIG": "c"}) == "b.toml"
    assert config_path(["stream"], {"PG2SINK_CONFIG": "c.toml"}) == "c.toml"
    assert config_path(["stream"], {}) is None


def test_a_stream_configured_by_the_file_alone(db: Database, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    path = write(
        tmp_path,
        f'source = "{db.dsn}"\nslot = "{db.slot}"\npublication = "{db.publication}"\n'
        f'file_path = "{out}"\npublication_poll_interval = "300ms"\nflush_interval = "100ms"\n',
    )
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    p = Pg2Sink(args=["--config", path], env=clean_env(), workdir=tmp_path).start()
    p.wait_streaming()
    with db.connect() as conn:
        conn.execute("INSERT INTO t SELECT generate_series(1, 3)")
    wait_for(
        lambda: (
            [r["after"]["id"] for r in read_jsonl(out) if r["kind"] == "modification"] == [1, 2, 3]
        ),
        what="the rows through the file's settings",
    )
    assert p.stop() == 0
