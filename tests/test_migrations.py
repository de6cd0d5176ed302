"""Every schema corral ever shipped is migrated up (issue 48 item 8): a store of each
(tests/data/schemas/, written from git history by build.py there) becomes one that is
the same as a fresh store's, keeps its rows, and `corral migrate --check` says what would
run before (exit 1) and nothing after (exit 0). A store of a newer corral is refused."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from corral.core.store import MIGRATIONS, open_store

SCHEMAS = Path(__file__).resolve().parent / "data" / "schemas"
CORRAL = [sys.executable, "-m", "corral.entry"]
FIXTURES = sorted(SCHEMAS.glob("v*.sql"), key=lambda p: (int(p.stem[1:].split("-")[0]), p.stem))


def _load(dump: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(where / "corral.db")
    db.executescript(dump.read_text())
    db.close()
    return where / "corral.db"


def _shape(path: Path) -> dict[str, object]:
    """Tables with their columns, indexes, triggers: what a store's code relies on."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
        out: dict[str, object] = {}
        for kind, name, table in rows:
            if kind == "table":
                out[f"table {name}"] = sorted(r[1] for r in db.execute(f"PRAGMA table_info('{name}')"))
            else:
                out[f"{kind} {name}"] = table
        return out
    finally:
        db.close()


def _check(home: Path) -> tuple[int, dict[str, object]]:
    r = subprocess.run([*CORRAL, "--json", "migrate", "--check", "--home", str(home)], capture_output=True, text=True,
                       timeout=120, env={**{k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")},
                                         "CORRAL_HOME": str(home)})
    return r.returncode, json.loads(r.stdout)


def test_a_store_of_every_shipped_version_is_kept() -> None:
    """Every version before this one has its store (build.py writes a new one)."""
    versions = {int(p.stem[1:].split("-")[0]) for p in FIXTURES}
    missing = set(range(1, len(MIGRATIONS))) - versions
    assert not missing, f"no store of schema versions {sorted(missing)}: run .venv/bin/python tests/data/schemas/build.py"


@pytest.mark.parametrize("dump", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_every_shipped_schema_migrates_up_with_its_rows(dump: Path, tmp_path: Path) -> None:
    fresh = open_store(tmp_path / "fresh" / "corral.db")
    fresh.close()
    path = _load(dump, tmp_path / "home")
    before = int(dump.stem[1:].split("-")[0])
    code, said = _check(path.parent)
    assert code == (1 if before < len(MIGRATIONS) else 0) and said["current"] == before
    assert said["latest"] == len(MIGRATIONS) and said["needed"] == (before < len(MIGRATIONS) or bool(said["repairs"]))
    assert [m["version"] for m in said["pending"]] == list(range(before + 1, len(MIGRATIONS) + 1))
    assert all(m["what"] for m in said["pending"])  # each said in words

    db = open_store(path)
    try:
        assert db.version == len(MIGRATIONS)
        assert db.get_principal("alice-bot").sponsor == "alice"
        done, running = db.get_job(1), db.get_job(2)
        assert done.state.value == "COMPLETED" and done.backend_id == "4242" and done.spec.command == "echo done"
        assert running.state.value == "RUNNING" and running.spec.memory_mb == 200 and running.spec.walltime_s == 900
        assert [j.id for j in db.active_jobs()] == [2]  # what the reconciler will ask Slurm about
        if before >= 3:
            assert [i for i, _ in db.memory.match(["gcc"], 5)] == [1]  # the note, found by its words
    finally:
        db.close()
    assert _shape(path) == _shape(tmp_path / "fresh" / "corral.db")
    assert _check(path.parent) == (0, {**said, "current": len(MIGRATIONS), "needed": False, "pending": [], "repairs": []})


def test_a_store_of_a_newer_corral_is_refused(tmp_path: Path) -> None:
    path = _load(FIXTURES[-1], tmp_path / "home")
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
    db.close()
    code, said = _check(path.parent)
    assert code == 2 and "newer than this corral's" in said["error"]["message"]
    from corral.core.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="newer than this corral"):
        open_store(path)


def test_migrate_brings_a_store_up_and_says_what_it_ran(tmp_path: Path) -> None:
    path = _load(FIXTURES[0], tmp_path / "home")
    r = subprocess.run([*CORRAL, "migrate", "--home", str(path.parent)], capture_output=True, text=True, timeout=120,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}})
    assert r.returncode == 0 and "ran 2:" in r.stdout and f"the store is at version {len(MIGRATIONS)}" in r.stdout, \
        r.stdout + r.stderr
    assert _check(path.parent)[0] == 0


PG_FIRST = 12
"""The first schema a PostgreSQL store had (97cb587). No migration from 12 on was edited
after it shipped, and the renderer (pg_statements) is unchanged since, so this corral's
own MIGRATIONS[:N], rendered, is the store a site on PostgreSQL has at N."""


def _pg_shape(url: str) -> dict[str, list[str]]:
    from corral.core.store.conn import Conn

    conn = Conn(url)
    try:
        rows = conn.all("SELECT table_name, column_name FROM information_schema.columns "
                        "WHERE table_schema = current_schema()")
        indexes = conn.all("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
    finally:
        conn.close()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(f"table {table}", []).append(column)
    out.update({f"index {i}": [] for (i,) in indexes})
    return {k: sorted(v) for k, v in out.items()}


def test_every_postgresql_schema_migrates_up_with_its_rows() -> None:
    from corral.core.store.conn import Conn
    from corral.core.store.migrations import pg_statements

    from .data.schemas.build import ROWS
    from .pg_env import fresh_database

    with fresh_database() as url:
        open_store(url).close()
        fresh = _pg_shape(url)
    for n in range(PG_FIRST, len(MIGRATIONS)):
        with fresh_database() as url:
            conn = Conn(url)
            with conn.transaction():
                for sql in MIGRATIONS[:n]:
                    for statement in pg_statements(sql):
                        conn.execute(statement)
                conn.execute("CREATE TABLE corral_schema (version INTEGER NOT NULL)")
                conn.execute("INSERT INTO corral_schema (version) VALUES (?)", (n,))
                for _, sql, values in ROWS:
                    conn.execute(sql, values)
            conn.close()
            db = open_store(url)
            try:
                assert db.version == len(MIGRATIONS)
                assert db.get_job(2).state.value == "RUNNING" and db.get_job(1).spec.command == "echo done"
                assert [j.id for j in db.active_jobs()] == [2]
                assert [i for i, _ in db.memory.match(["gcc"], 5)] == [1]
            finally:
                db.close()
            assert _pg_shape(url) == fresh, f"schema {n} migrated differs from a fresh store"
