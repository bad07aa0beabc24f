"""The Docker image's build, checked without Docker: what its wheel holds, and that it runs.

No Docker engine runs where pg2sink is developed, so these tests read the Dockerfile and
do what it does with the tools at hand. The build context is the repository less
.dockerignore; the stage that builds the wheel gets exactly the files its COPY lines
copy (copied the way Docker copies them), and the wheel is built from that copy. The
wheel must hold what a checkout has (SQL migrations, the C extension, package data),
and, installed (not editable) in a fresh virtualenv with the extras the image installs,
it must migrate, import and stream against a real PostgreSQL with no file of this
repository in reach. The image's Java, JDBC driver and environment are checked from the
Dockerfile's text.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath

import jdbc_driver
import pytest

from tests.conftest import REPO, Database, Pg2Sink, clean_env, read_jsonl, wait_for
from tests.observability.test_compose import stream_env_names

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
MIGRATIONS = REPO / "migrations"

#: Installing the extras into a fresh virtualenv and starting Spark take a while.
pytestmark = pytest.mark.slow


# --- the Dockerfile, parsed --------------------------------------------------------------


@dataclass
class Stage:
    """One FROM ... section of the Dockerfile: its base image and (instruction, arguments)."""

    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def runs(self) -> list[str]:
        return [args for instr, args in self.instructions if instr == "RUN"]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for instr, args in self.instructions:
            if instr == "ENV":
                for item in shlex.split(args):
                    key, _, value = item.partition("=")
                    out[key] = value
        return out


@cache
def stages() -> list[Stage]:
    """The Dockerfile's stages, continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(
            line
            for line in DOCKERFILE.read_text().splitlines()
            if not line.lstrip().startswith("#")
        ),
    )
    out: list[Stage] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        instr, _, args = line.strip().partition(" ")
        instr, args = instr.upper(), args.strip()
        if instr == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(out))
            out.append(Stage(words[0], name))
        else:
            assert out, f"{instr} before FROM in the Dockerfile"
            out[-1].instructions.append((instr, args))
    return out


@dataclass(frozen=True)
class Copy:
    """A COPY instruction: --from stage (None: the build context), sources, destination."""

    source_stage: str | None
    sources: tuple[str, ...]
    dest: str


def parse_copy(args: str) -> Copy:
    words = json.loads(args) if args.startswith("[") else shlex.split(args)
    flags = {}
    while words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    assert len(words) >= 2, f"COPY {args}: no destination"
    return Copy(flags.get("from"), tuple(words[:-1]), words[-1])


# --- the build context and Docker's COPY --------------------------------------------------


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regular expression (Go's filepath.Match plus `**`)."""
    assert not set(pattern) & set("[]\\"), f".dockerignore: {pattern!r} is beyond this parser"
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out + r"\Z")


@cache
def ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, regex) per .dockerignore line, in order: the last one that matches wins."""
    rules = []
    text = DOCKERIGNORE.read_text() if DOCKERIGNORE.exists() else ""  # none: all is sent
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").lstrip("/"))
        rules.append((not negated, _ignore_regex(pattern)))
    return rules


def in_context(rel: str) -> bool:
    """Whether a repository path is in the build context: a pattern that matches the path
    or one of its parent directories decides, as in Docker."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for excludes, regex in ignore_rules():
        if any(regex.match(p) for p in prefixes):
            included = not excludes
    return included


def context_files(source: str) -> list[tuple[Path, str]]:
    """(file, path relative to the source) for a COPY source: a file, or a directory's
    files (a directory's contents are copied, not the directory itself)."""
    path = REPO / source
    assert path.exists(), f"the Dockerfile copies {source!r}, which the repository lacks"
    if path.is_file():
        return [(path, path.name)] if in_context(source) else []
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        base = Path(dirpath)
        dirnames[:] = [d for d in dirnames if in_context((base / d).relative_to(REPO).as_posix())]
        for name in filenames:
            rel = (base / name).relative_to(REPO).as_posix()
            if in_context(rel):
                out.append((base / name, (base / name).relative_to(path).as_posix()))
    return out


def replay(stage: Stage, root: Path, until: Callable[[str], bool]) -> PurePosixPath:
    """Perform a stage's COPY lines from the build context into `root` (the container's
    /) up to its first RUN for which `until` holds; that RUN's working directory."""
    workdir = PurePosixPath("/")
    for instr, args in stage.instructions:
        if instr == "WORKDIR":
            workdir = workdir / args
        elif instr == "COPY":
            c = parse_copy(args)
            assert c.source_stage is None, f"stage {stage.name}: COPY {args} is not replayed"
            dest = workdir / c.dest
            into_dir = c.dest.endswith("/") or len(c.sources) > 1
            for source in c.sources:
                is_dir = (REPO / source).is_dir()
                for file, rel in context_files(source):
                    target = dest / rel if (is_dir or into_dir) else dest
                    out = root / target.relative_to("/")
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(file, out)
        elif instr == "RUN" and until(args):
            return workdir
    raise AssertionError(f"stage {stage.name}: no such RUN")


def builds_the_project(run: str) -> bool:
    words = shlex.split(run)
    return "pip" in " ".join(words) and any(w == "." or w.startswith(".[") for w in words)


def stage_running(what: Callable[[str], bool]) -> Stage:
    """The one stage with a RUN for which `what` holds."""
    found = [s for s in stages() if any(what(r) for r in s.runs())]
    assert len(found) == 1, "one stage of the Dockerfile does it"
    return found[0]


def runs_jdbc_driver(run: str) -> bool:
    return "scripts/jdbc_driver.py" in run


def image_extras() -> set[str]:
    """The extras the image's `pip install` of pg2sink (`.[...]`, `x.whl[...]`,
    `"$(...)"[...]`) asks for."""
    for run in (r for stage in stages() for r in stage.runs() if "pip install" in r):
        if match := re.search(r"(?:\.|\.whl|\))[\"']?\[([a-z0-9_,-]+)\]", run):
            return set(match.group(1).split(","))
    return set()


# --- wheels ------------------------------------------------------------------------------


def build_wheel(source: Path, dist: Path) -> Path:
    """`pip wheel` of a source tree (with build isolation, as in the image)."""
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (wheel,) = dist.glob("pg2sink-*.whl")
    return wheel


def wheel_files(wheel: Path) -> set[str]:
    """The wheel's members, its .dist-info (which lists them with hashes) left out."""
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    """A scratch directory removed at the end: a virtualenv with Spark is ~1 GB, more
    than pytest's kept temporary directories should hold."""
    path = Path(tempfile.mkdtemp(prefix="pg2sink-packaging-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def image_wheel(workspace: Path) -> Path:
    """The wheel built from exactly the files the Dockerfile copies before building it."""
    root = workspace / "build-stage"
    workdir = replay(stage_running(builds_the_project), root, builds_the_project)
    return build_wheel(root / workdir.relative_to("/"), workspace / "dist-image")


def test_the_wheel_holds_every_migration_and_the_c_extensions(image_wheel: Path) -> None:
    files = wheel_files(image_wheel)
    packaged = sorted(PurePosixPath(f).name for f in files if f.startswith("pg2sink/_migrations/"))
    assert packaged == sorted(p.name for p in MIGRATIONS.glob("*.sql")), files
    for extension in ("_avro_native", "_rows_native"):
        built = rf"pg2sink/changelog/{extension}\..*\.so"
        assert [f for f in files if re.fullmatch(built, f)], files
    assert "pg2sink/imports/log4j2.properties" in files


def test_the_dockerfile_copies_every_file_the_wheel_needs(
    workspace: Path, image_wheel: Path
) -> None:
    """A wheel built from a checkout (tracked and new files, not ignored ones) has nothing
    the image's wheel lacks."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    checkout = workspace / "checkout"
    for rel in filter(None, listed.split("\0")):
        if (REPO / rel).is_file():  # a file deleted but not yet committed is listed too
            (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, checkout / rel)
    full = build_wheel(checkout, workspace / "dist-checkout")
    assert wheel_files(full) - wheel_files(image_wheel) == set()


# --- the wheel installed and run ---------------------------------------------------------


@dataclass
class InstalledPg2Sink(Pg2Sink):
    """pg2sink run by the console script of another virtualenv, from a directory outside
    the repository (nothing of the checkout is importable)."""

    venv: Path = Path()

    def start(self) -> InstalledPg2Sink:
        self.runs += 1
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [str(self.venv / "bin" / "pg2sink"), *self.args],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=self.workdir,
            )
        return self


def image_jdbc_copy() -> Copy:
    """The final stage's COPY --from of the jar PG2SINK_JDBC_DRIVER names."""
    final = stages()[-1]
    jar = final.env().get("PG2SINK_JDBC_DRIVER")
    copies = [parse_copy(a) for i, a in final.instructions if i == "COPY"]
    found = [c for c in copies if c.dest == jar and c.source_stage and len(c.sources) == 1]
    assert found, f"the image copies no jar to PG2SINK_JDBC_DRIVER={jar}: {copies}"
    return found[0]


def image_jdbc_driver(workspace: Path) -> Path:
    """Run the Dockerfile's `scripts/jdbc_driver.py` RUN line on a copy of the files its
    stage copied, each absolute path of the line under that copy; the jar it wrote. A
    warm cache (the jar `make setup` fetched) spares the download."""
    stage = stage_running(runs_jdbc_driver)
    root = workspace / "jdbc-stage"
    workdir = replay(stage, root, runs_jdbc_driver)
    (run,) = [r for r in stage.runs() if runs_jdbc_driver(r)]
    words = shlex.split(run)
    assert words[0].startswith("python") and words[1] == "scripts/jdbc_driver.py", run
    args = [str(root / w.lstrip("/")) if w.startswith("/") else w for w in words[2:]]
    cache_dir = workspace / "cache"
    (cache_dir / "jdbc").mkdir(parents=True)
    warm = jdbc_driver.jdbc_driver()
    shutil.copy2(warm, cache_dir / "jdbc" / warm.name)
    res = subprocess.run(
        [sys.executable, "-I", "scripts/jdbc_driver.py", *args],
        capture_output=True,
        text=True,
        cwd=root / workdir.relative_to("/"),
        env={**clean_env(), "PG2SINK_SERVICES_CACHE": str(cache_dir)},
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    jar = root / image_jdbc_copy().sources[0].lstrip("/")
    with zipfile.ZipFile(jar) as z:
        assert "org/postgresql/Driver.class" in z.namelist()
    return jar


def test_the_installed_wheel_migrates_imports_and_streams(
    db: Database, workspace: Path, image_wheel: Path
) -> None:
    venv = workspace / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    extras = ",".join(sorted(image_extras()))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            f"{image_wheel}[{extras}]",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    outside = workspace / "run"
    outside.mkdir()
    env = {
        **clean_env(),
        "PG2SINK_SOURCE": db.dsn,
        "PG2SINK_NO_IMPORTS": "0",
        "PG2SINK_JDBC_DRIVER": str(image_jdbc_driver(workspace)),
    }
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import pg2sink.changelog._avro_native as n, pg2sink.imports.migrate as m;"
            " print(n.__file__, m.migrations_dir())",
        ],
        capture_output=True,
        text=True,
        cwd=outside,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    assert str(REPO) not in where.stdout and str(venv) in where.stdout

    migrate = subprocess.run(
        [str(venv / "bin" / "pg2sink"), "migrate"],
        capture_output=True,
        text=True,
        cwd=outside,
        env=env,
        timeout=60,
    )
    assert migrate.returncode == 0, migrate.stderr
    for sql_file in MIGRATIONS.glob("*.sql"):
        assert sql_file.stem in migrate.stdout, migrate.stdout

    conn = db.connect()
    conn.execute("CREATE TABLE public.t (id int PRIMARY KEY, name text)")
    conn.execute("INSERT INTO public.t VALUES (1, 'before'), (2, 'before')")
    out = outside / "changes.jsonl"
    proc = InstalledPg2Sink(
        args=[
            "stream",
            "--file-path",
            str(out),
            "--slot",
            db.slot,
            "--publication",
            db.publication,
            "--flush-interval",
            "0.1s",
            "--spark-master",
            "local[1]",
        ],
        env=env,
        workdir=outside,
        venv=venv,
    ).start()
    try:
        proc.wait_streaming(60)
        conn.execute("INSERT INTO public.t VALUES (3, 'streamed')")

        def arrived() -> set[tuple[str, int]]:
            assert proc.proc is not None and proc.proc.poll() is None, proc.stderr()
            got = {
                (r["operation"], r["after"]["id"])
                for r in read_jsonl(out)
                if r["kind"] == "modification"
            }
            return got if {("IMPORT", 1), ("IMPORT", 2), ("INSERT", 3)} <= got else set()

        wait_for(arrived, 120, "the imported rows and the streamed insert")
        assert proc.stop() == 0, proc.stderr()
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill()
    assert "Traceback" not in proc.stderr()


def test_an_install_without_migrations_is_one_clear_line(db: Database, tmp_path: Path) -> None:
    """What the image's wheel used to be: `migrate` applied nothing and said so, and the
    stream then stopped on a missing table. Now it is an error naming the cause."""
    shutil.copytree(REPO / "pg2sink", tmp_path / "pg2sink")
    res = subprocess.run(
        [sys.executable, "-m", "pg2sink", "migrate"],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # the copy comes first on sys.path, before the editable install
        env={**clean_env(), "PG2SINK_SOURCE": db.dsn},
        timeout=60,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "installed without its SQL migrations" in res.stderr


# --- what the image installs beside the wheel --------------------------------------------


def test_the_image_has_java_for_spark_and_the_jdbc_driver() -> None:
    final = stages()[-1]
    apt = " ".join(r for r in final.runs() if "apt-get install" in r)
    java = re.search(r"openjdk-(\d+)-jre-headless", apt)
    assert java, "the image installs a headless JRE"
    # Spark 4 runs on Java 17 and 21; Debian 12 (bookworm) packages 17, Debian 13 21
    debian = {"bookworm": "17", "trixie": "21"}
    release = next((r for r in debian if final.base.endswith(f"-{r}")), None)
    assert release, f"the base image {final.base} names its Debian release"
    assert java.group(1) == debian[release]
    assert {"kafka", "spark"} <= image_extras()
    assert image_jdbc_copy().source_stage == stage_running(runs_jdbc_driver).name


def test_the_images_environment_names_real_flags() -> None:
    for stage in stages():
        for key in stage.env():
            if key.startswith("PG2SINK_"):
                assert key in stream_env_names(), key


def test_the_build_context_leaves_out_local_state() -> None:
    for rel in (
        ".venv/bin/python",
        ".services/env",
        ".git/HEAD",
        "pg2sink/__pycache__/x.pyc",
        "pg2sink/changelog/_avro_native.cpython-311-x86_64-linux-gnu.so",
        "pg2sink.egg-info/PKG-INFO",
        "build/lib/x.py",
        "dist/x.whl",
    ):
        assert not in_context(rel), rel
    for rel in (
        "pyproject.toml",
        "setup.py",
        "pg2sink/cli.py",
        "migrations/0001.import-jobs.sql",
        "scripts/jdbc_driver.py",
    ):
        assert in_context(rel), rel


def test_the_bigquery_sink_needs_no_duckdb() -> None:
    """The `bigquery` extra installs no duckdb, so no module of the BigQuery sink (nor the
    warehouse code it shares with the DuckDB sink) may import it: each is imported in a
    fresh interpreter and duckdb must not be among its modules."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert not [d for d in extras["bigquery"] if d.startswith("duckdb")]
    code = (
        "import importlib, pkgutil, sys\n"
        "import pg2sink.sinks.bigquery as bq, pg2sink.sinks.warehouse as wh\n"
        "for package in (bq, wh):\n"
        "    for m in pkgutil.iter_modules(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'duckdb'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
