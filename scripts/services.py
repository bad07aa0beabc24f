#!/usr/bin/env python3
"""Real servers for tests, demos and benchmarks, started without Docker.

`make services` runs `python scripts/services.py start`, which starts the
servers on loopback with free ports and writes their addresses to a
shell-sourceable `.services/env`; `make services-stop` stops them. The test
suite imports this module to start a throwaway PostgreSQL of its own.

Only the standard library is used so the script runs before the virtualenv
exists. PostgreSQL comes from Debian's packages (installed by `make setup`);
initdb refuses to run as root, so as root the server runs as the `postgres`
system user that the Debian package creates.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / ".services"

# Settings every pg2sink test server needs: logical decoding, room for many
# slots (each test uses its own), and loopback only. fsync is off because
# these servers hold throwaway data; pg2sink's own durability is tested by
# killing pg2sink, not the server.
POSTGRES_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "64",
    "max_wal_senders": "64",
    "max_connections": "200",
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "256MB",
    "max_wal_size": "4GB",
    "wal_sender_timeout": "60s",
    "log_min_messages": "warning",
}


class ServiceError(RuntimeError):
    """A service could not be started; the message names it and shows its log."""


def free_port() -> int:
    """Ask the kernel for a free TCP port on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def postgres_bindir() -> Path:
    """The newest installed PostgreSQL server's bin directory (Debian layout)."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if not candidates:
        found = shutil.which("pg_ctl")
        if found:
            return Path(os.path.realpath(found)).parent
        raise ServiceError(
            "postgres: no PostgreSQL server binaries found; run `make setup` "
            "(it installs Debian's postgresql package)"
        )
    return Path(candidates[-1]).parent


def _as_server_user(cmd: Sequence[str]) -> list[str]:
    """Run server programs as `postgres` when we are root (initdb refuses root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return list(cmd)


def _chown_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, user="postgres", group="postgres")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Postgres:
    """A PostgreSQL cluster in `base` listening on 127.0.0.1:`port`."""

    base: Path
    port: int
    user: str = "postgres"
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def log(self) -> Path:
        return self.base / "postgres.log"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname}"

    def env(self) -> dict[str, str]:
        return {
            "PGHOST": self.host,
            "PGPORT": str(self.port),
            "PGUSER": self.user,
            "PGDATABASE": "postgres",
        }

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = _as_server_user([str(postgres_bindir() / "pg_ctl"), "-D", str(self.data), *args])
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    def start(self) -> Postgres:
        """initdb when needed, then start and wait until connections are accepted."""
        self.base.mkdir(parents=True, exist_ok=True)
        _chown_to_server_user(self.base)
        if not (self.data / "PG_VERSION").exists():
            initdb = _as_server_user(
                [
                    str(postgres_bindir() / "initdb"),
                    "-D",
                    str(self.data),
                    "-A",
                    "trust",
                    "-U",
                    self.user,
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    "--no-sync",
                ]
            )
            res = subprocess.run(initdb, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise ServiceError(f"postgres: initdb failed:\n{res.stdout}{res.stderr}")
        settings = {**POSTGRES_SETTINGS, **self.settings}
        settings["port"] = str(self.port)
        settings["unix_socket_directories"] = str(self.base)
        opts = " ".join(f"-c {k}={shlex.quote(v)}" for k, v in settings.items())
        res = self._pg_ctl("-o", opts, "-l", str(self.log), "-w", "-t", "60", "start")
        if res.returncode != 0:
            raise ServiceError(
                f"postgres: failed to start on port {self.port}: {res.stderr.strip()}\n"
                f"--- tail of {self.log} ---\n{_tail(self.log)}"
            )
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("-m", mode, "-w", "stop")

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


def write_env(path: Path, values: Mapping[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"export {k}={shlex.quote(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")


def read_env(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.removeprefix("export ").strip()
        if "=" in line:
            k, v = line.split("=", 1)
            parts = shlex.split(v)
            out[k] = parts[0] if parts else ""
    return out


def _postgres_in(directory: Path) -> Postgres:
    port_file = directory / "postgres.port"
    port = int(port_file.read_text()) if port_file.exists() else free_port()
    port_file.parent.mkdir(parents=True, exist_ok=True)
    port_file.write_text(str(port))
    return Postgres(base=directory / "postgres", port=port)


def _port_open(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def cmd_start(directory: Path) -> int:
    pg = _postgres_in(directory)
    if _port_open(pg.port) and (pg.data / "postmaster.pid").exists():
        print(f"postgres: already running on {pg.host}:{pg.port}")
    else:
        t0 = time.monotonic()
        try:
            pg.start()
        except ServiceError as e:
            print(str(e), file=sys.stderr)
            return 1
        print(f"postgres: started on {pg.host}:{pg.port} in {time.monotonic() - t0:.1f}s")
    env_path = directory / "env"
    env = read_env(env_path)
    env.update(pg.env())
    write_env(env_path, env)
    print(f"wrote {env_path}")
    return 0


def cmd_stop(directory: Path) -> int:
    pg = _postgres_in(directory)
    pg.stop()
    print("postgres: stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["start", "stop", "env"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory")
    args = parser.parse_args(argv)
    if args.command == "start":
        return cmd_start(args.dir)
    if args.command == "stop":
        return cmd_stop(args.dir)
    sys.stdout.write((args.dir / "env").read_text() if (args.dir / "env").exists() else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
