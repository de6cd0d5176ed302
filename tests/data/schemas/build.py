"""Write a store of every schema corral ever shipped, as SQL dumps, from git history.

corral has no release tags: every commit of main is one a site may run. So "every
released schema" is every distinct list of migrations a commit of main held: for each
version N, the migrations as the first commit with N of them wrote them, and again for
every later commit that edited one of them in place (migration 3 was, three times on
2026-11-30: ``v3-809042a.sql`` and the like). Each dump is that schema run on an empty
SQLite file, then the same few rows (``ROWS``) in whatever of them that version has:
people, an agent, a token, jobs (one still RUNNING in Slurm), a note, the audit's head.
tests/test_migrations.py migrates each one up and checks the rows survive.

    .venv/bin/python tests/data/schemas/build.py      # from the repository; rewrites the dumps

Run it again after a commit that adds a migration (the test names the versions missing).
"""

from __future__ import annotations

import ast
import hashlib
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FILES = ("corral/core/store/migrations.py", "corral/db.py")
SHADOW = re.compile(r"""^(CREATE TABLE|INSERT INTO) ['"]notes_(fts_data|fts_idx|fts_content|fts_docsize|fts_config|vocab)['"]""")

ROWS: list[tuple[int, str, tuple[object, ...]]] = [
    # (first version with the table, statement, values): what each fixture carries; the
    # specs as the first corral wrote them (JobSpec.model_dump_json(by_alias=True, exclude_none=True))
    (1, "INSERT INTO principals (name, kind, sponsor, unix_user, account, is_admin, created) VALUES (?,?,?,?,?,?,?)",
     ("alice", "human", None, "alice", "proj1", 0, 1764000000.0)),
    (1, "INSERT INTO principals (name, kind, sponsor, unix_user, account, is_admin, created) VALUES (?,?,?,?,?,?,?)",
     ("alice-bot", "agent", "alice", None, "proj1", 0, 1764000001.0)),
    (1, "INSERT INTO tokens (id, principal, hash, created, expires, revoked, note) VALUES (?,?,?,?,?,?,?)",
     ("tok1", "alice-bot", "9f" * 32, 1764000002.0, None, None, "from the fixture")),
    (1, "INSERT INTO jobs (id, principal, session, idem_key, backend, backend_id, state, exit_code, reason, "
        "submit_time, start_time, end_time, spec) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
     (1, "alice-bot", "s1", "k1", "slurm", "4242", "COMPLETED", 0, None, 1764000010.0, 1764000011.0, 1764000020.0,
      '{"command":"echo done","env":{},"cpus":1,"memory":100,"gpus":0,"walltime":60,"labels":{}}')),
    (1, "INSERT INTO jobs (id, principal, session, idem_key, backend, backend_id, state, exit_code, reason, "
        "submit_time, start_time, end_time, spec) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
     (2, "alice-bot", "s1", None, "slurm", "4243", "RUNNING", None, None, 1764000030.0, 1764000031.0, None,
      '{"command":"sleep 600","env":{},"cpus":2,"memory":200,"gpus":0,"walltime":900,"labels":{}}')),
    (3, "INSERT INTO notes (id, text, scope, author, family, account, session, job_id, created, expires, flags) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
     (1, "module load gcc before make", "account", "alice", "build", "proj1", None, None, 1764000040.0, None, None)),
    (3, "INSERT INTO notes_fts (rowid, text) VALUES (?, ?)", (1, "module load gcc before make")),
]


def _migrations(commit: str) -> list[str] | None:
    for path in FILES:
        src = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True).stdout
        for node in ast.walk(ast.parse(src)) if "MIGRATIONS" in src else ():
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and getattr(target, "id", None) == "MIGRATIONS":
                return list(ast.literal_eval(node.value))  # type: ignore[arg-type]
    return None


def shipped() -> dict[str, tuple[str, list[str]]]:
    """name -> (the commit, its migrations): each version, and each in-place edit of one."""
    shipped_now = len(_migrations("HEAD") or [])  # a commit's later revert (c76bfec) shipped no more than HEAD
    log = subprocess.run(["git", "log", "--first-parent", "--reverse", "--format=%h", "HEAD", "--", *FILES],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    out: dict[str, tuple[str, list[str]]] = {}
    seen: dict[int, str] = {}  # version -> the digest of its migrations as last shipped
    for commit in log:
        migs = _migrations(commit)
        if not migs:
            continue
        for n in range(1, min(len(migs), shipped_now) + 1):
            digest = hashlib.sha1(" ".join(" ".join(migs[:n]).split()).encode()).hexdigest()
            if seen.get(n) == digest:
                continue
            name = f"v{n}" if n not in seen else f"v{n}-{commit}"
            seen[n] = digest
            out[name] = (commit, migs[:n])
    return out


def build(migrations: list[str]) -> str:
    """The schema run on an empty database with ROWS in it, as a dump."""
    sys.path.insert(0, str(ROOT))
    from corral.core.store.migrations import _statements

    db = sqlite3.connect(":memory:")
    for sql in migrations:
        for statement in _statements(sql):
            db.execute(statement)
    n = len(migrations)
    for since, sql, values in ROWS:
        if n >= since:
            db.execute(sql, values)
    if n >= 7:  # job_events' times are its triggers' clock: fixed, so that a dump is the same every time
        db.execute("UPDATE job_events SET at = 1764000050.0")
    db.commit()
    lines = [f"-- corral store at schema version {n} (tests/data/schemas/build.py)", f"PRAGMA user_version={n};"]
    lines += [line for line in db.iterdump() if not line.startswith(("BEGIN", "COMMIT")) and not SHADOW.search(line)]
    if n >= 3:  # full-text search's own tables are made by CREATE VIRTUAL TABLE; its index, from the notes
        lines.append("INSERT INTO notes_fts(notes_fts) VALUES('rebuild');")
    return "\n".join(lines) + "\n"


def main() -> None:
    for name, (commit, migs) in shipped().items():
        (HERE / f"{name}.sql").write_text(f"-- as shipped by commit {commit}\n" + build(migs))
        print(f"{name}.sql: {len(migs)} migrations, from {commit}")


if __name__ == "__main__":
    main()
