"""--nats-config FILE: a nats CLI context file (pg2sink/sinks/nats/context.py).

The files are written the way `nats context save` writes them (every key, the unused
ones empty); logins go to a nats-server of the test's own that wants a password.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from pg2sink.sinks.nats.config import DEFAULT_URL, NatsConfig
from pg2sink.sinks.nats.context import NatsContext
from tests.conftest import Database, run_cli, wait_for
from tests.sinks.nats.nats_support import stored
from tests.sinks.nats.test_nats import (
    NO_SERVER,
    PASSWORD,
    PasswordNats,
    password_nats,  # noqa: F401 (a fixture)
)
from tests.support import FAST, Proc

SECRET = "Hunter2xyz"

#: what `nats context save NAME` writes (natscli's natscontext settings), all unset
SAVED: dict[str, Any] = {
    "description": "",
    "url": "",
    "socks_proxy": "",
    "token": "",
    "user": "",
    "password": "",
    "creds": "",
    "nkey": "",
    "cert": "",
    "key": "",
    "ca": "",
    "nsc": "",
    "jetstream_domain": "",
    "jetstream_api_prefix": "",
    "jetstream_event_prefix": "",
    "inbox_prefix": "",
    "user_jwt": "",
    "user_seed": "",
    "color_scheme": "",
    "tls_first": False,
    "windows_cert_store": "",
    "windows_cert_match_by": "",
    "windows_cert_match": "",
    "windows_ca_certs_match": None,
}


def context_file(d: Path, **settings: Any) -> str:
    path = d / "ctx.json"
    path.write_text(json.dumps({**SAVED, **settings}, indent=2))
    return str(path)


def test_a_saved_context_gives_its_settings_and_flags_override_them_by_group(
    tmp_path: Path,
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    path = context_file(
        tmp_path, url="nats://n1:4222,nats://n2:4222", user="me", password=SECRET, ca=str(ca)
    )
    ctx = NatsContext.load(path)
    assert SECRET not in repr(ctx) and ctx.secrets() == [SECRET]
    cfg = NatsConfig(nats_config=ctx)
    assert (cfg.nats_url, cfg.nats_user, cfg.nats_password) == (
        "nats://n1:4222,nats://n2:4222",
        "me",
        SECRET,
    )
    assert cfg.nats_tls_ca == str(ca) and SECRET not in repr(cfg)
    assert SECRET in cfg.secrets()
    # a token given as a flag replaces the file's whole login: no user beside it
    flagged = NatsConfig(nats_config=ctx, nats_token="tok", nats_url="nats://h:1")
    assert (flagged.nats_user, flagged.nats_password, flagged.nats_token) == (None, None, "tok")
    assert flagged.nats_url == "nats://h:1" and flagged.nats_tls_ca == str(ca)
    flagged.check()
    # the CLI's dataclasses.replace() runs the merge again: the same result
    assert dataclasses.replace(flagged, format="json") == flagged
    # an empty context leaves pg2sink's defaults
    empty = NatsConfig(nats_config=NatsContext.load(context_file(tmp_path)))
    assert empty.nats_url == DEFAULT_URL and empty.nats_user is None


def bad_files(d: Path) -> dict[str, tuple[str, str]]:
    """name -> (file, the error's words); each file holds SECRET."""
    unreadable = d / "a-directory.json"  # the tests run as root: no mode stops reading
    unreadable.mkdir()
    raw = {
        "missing": (str(d / "nope.json"), "cannot read --nats-config"),
        "unreadable": (str(unreadable), "cannot read --nats-config"),
        "not JSON": (f'{{"user": "me", "password": "{SECRET}",}}', "not JSON"),
        "not an object": (json.dumps([SECRET]), "expected a JSON object"),
        "unknown key": (json.dumps({"user": "me", "pasword": SECRET}), "unknown key 'pasword'"),
        "unsupported": (json.dumps({**SAVED, "user_seed": SECRET}), "user_seed is set"),
        "not a string": (json.dumps({"user": "me", "password": [SECRET]}), "must be a string"),
        "password alone": (json.dumps({"password": SECRET}), "password needs user"),
        "bad url": (json.dumps({"url": f"http://me:{SECRET}@h:1"}), "url: expected nats://"),
        "missing ca": (
            json.dumps({"user": "me", "password": SECRET, "ca": str(d / "no-ca.pem")}),
            "cannot read ca",
        ),
    }
    out = {}
    for i, (name, (text, words)) in enumerate(raw.items()):
        if name in ("missing", "unreadable"):
            out[name] = (text, words)
            continue
        path = d / f"bad{i}.json"
        path.write_text(text)
        out[name] = (str(path), words)
    return out


def test_bad_files_are_one_line_exit_2_without_their_secrets(tmp_path: Path) -> None:
    for name, (path, words) in bad_files(tmp_path).items():
        for how in ("flag", "env"):
            args = ("--sink", "nats", "--nats-config", path) if how == "flag" else ()
            env = {**NO_SERVER, "PG2SINK_SINK": "nats"}
            if how == "env":
                env["PG2SINK_NATS_CONFIG"] = path
            res = run_cli(*args, env=env)
            printed = res.stdout + res.stderr
            assert res.returncode == 2, (name, printed)
            assert len(res.stderr.strip().splitlines()) == 1, (name, printed)
            assert words in res.stderr, (name, printed)
            assert SECRET not in printed, (name, printed)
    good = context_file(tmp_path, password=SECRET, user="me")
    res = run_cli("--sink", "nats", "--help", env={"PG2SINK_NATS_CONFIG": good})
    assert res.returncode == 0 and "--nats-config FILE" in res.stdout
    assert SECRET not in res.stdout + res.stderr


def test_only_a_context_file_logs_in_and_streams(
    db: Database,
    pg2sink_proc: Proc,
    password_nats: PasswordNats,  # noqa: F811 (the fixture imported above)
    topic_prefix: str,
    tmp_path: Path,
) -> None:
    conn = db.connect()
    conn.execute("CREATE TABLE t (id int primary key)")
    path = context_file(tmp_path, url=password_nats.url, user="me", password=PASSWORD)
    p = pg2sink_proc(
        "--sink", "nats", "--nats-config", path, "--nats-subject-prefix", topic_prefix,
        "--log-level", "debug", *FAST,
    )  # fmt: skip
    p.start()
    p.wait_streaming()
    conn.execute("INSERT INTO t VALUES (1)")
    login = password_nats.url.replace("nats://", f"nats://me:{PASSWORD}@")
    wait_for(lambda: len(stored(login, topic_prefix)) == 2, 30, "the insert")
    assert stored(login, topic_prefix)[1].value["after"] == {"id": 1}
    assert p.stop() == 0
    err = p.stderr()
    assert f"connected to NATS at {password_nats.url}" in err and PASSWORD not in err


def test_a_wrong_password_in_the_file_is_one_line_exit_2(
    password_nats: PasswordNats,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    wrong = f"{PASSWORD}-not"
    path = context_file(tmp_path, url=password_nats.url, user="me", password=wrong)
    res = run_cli("--sink", "nats", "--nats-config", path, env=NO_SERVER)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"cannot connect to NATS at {password_nats.url}: " in res.stderr
    assert "authorization violation" in res.stderr.lower()
    assert wrong not in res.stdout + res.stderr
    # the flag overrides the file's password: the right one lets pg2sink in (it then
    # stops at PostgreSQL, which NO_SERVER points nowhere)
    res = run_cli(
        "--sink", "nats", "--nats-config", path, "--nats-user", "me",
        "--nats-password", PASSWORD, env=NO_SERVER,
    )  # fmt: skip
    assert res.returncode == 2 and "NATS" not in res.stderr, res.stderr
    assert "PostgreSQL" in res.stderr and PASSWORD not in res.stderr
