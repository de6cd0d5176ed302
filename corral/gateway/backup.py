"""``corral backup`` and ``corral restore``: a gateway's state, taken while it serves,
put back on a fresh home (docs/deploy.md, "Operations"; decision 0059).

What a backup holds, in a directory of its own (0700), each file's digest in
``manifest.json``:

- the store: SQLite through its online backup API (a consistent copy while the gateway
  writes; WAL included), or PostgreSQL through ``pg_dump --format=custom`` (one snapshot);
- the keys (audit.key, token.key, mcp-tasks.key) and the admin's token: without the audit
  key the chain cannot be verified, without the token key no token minted verifies;
- the identities: identities.json, the dynamic uid each principal was given (a restored
  principal keeps its uid, so files it left stay its own);
- the audit chain: every closed segment and the live file up to its last whole record.

Order matters: the store is copied first, the audit after, so the chain copied reaches at
least the head the store recorded (verify then finds no tail cut off). Jobs' files
(``[slurm] jobs_dir``), images and workspaces are not in it: they are on the shared
filesystem a site backs up already, or rebuilt.

A restore refuses a home a gateway runs on, a home that holds a gateway's state already
(the chains would mix), a store that is not empty, and a backup of a newer schema; it
verifies the chain from the backup before it writes anything.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

from corral.core import proc
from corral.core.config import Settings
from corral.core.errors import InvalidRequest
from corral.core.store import MIGRATIONS, open_store
from corral.core.store.conn import is_postgres

FORMAT = 1
SECRETS = ("audit.key", "token.key", "mcp-tasks.key", "admin.token")
STATE = ("identities.json", "corral.toml", "policy.cedar")
"""Files of the home copied when present (the settings and the policy when they live there)."""
HELD = ("corral.db", "audit.jsonl", "audit.key", "token.key")
"""What makes a home a gateway's already: a restore onto it is refused."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("corral")
    except PackageNotFoundError:  # pragma: no cover - run from a tree without its metadata
        return "unknown"


# -- backup ------------------------------------------------------------------------------


def backup(settings: Settings, dest: Path) -> dict[str, Any]:
    """Write a backup of the gateway at ``settings.home`` into ``dest`` (new or empty)."""
    home = settings.home
    if not (home / "audit.key").exists():
        raise InvalidRequest(f"no gateway state under {home}", hint="pass --home (or CORRAL_HOME) naming the gateway's state directory")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InvalidRequest(f"{dest} exists and is not an empty directory", hint="name a new directory for the backup")
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    _private(dest, "the backup's directory", closed=False)
    os.chmod(dest, 0o700)  # it holds the keys
    started = time.time()
    store = _store_out(settings, dest)
    for name in (*SECRETS, *STATE):
        if (home / name).is_file():
            _copy(home / name, dest / name)
    (dest / "audit").mkdir(mode=0o700)
    _private(dest / "audit", "the backup's audit directory")
    audit_files = _audit_out(home, dest / "audit")
    files = {str(p.relative_to(dest)): {"sha256": _digest(p), "bytes": p.stat().st_size}
             for p in sorted(dest.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT, "corral": _version(), "created": started, "took_s": round(time.time() - started, 3),
                "home": str(home), **store, "audit_files": audit_files, "files": files}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    os.chmod(dest / "manifest.json", 0o600)
    return manifest


def _private(d: Path, what: str, closed: bool = True) -> None:
    """``d`` is a directory (not a link) of the one running this, closed to others' writes.
    Run as root, a backup written into, or restored from, a directory another user owns
    or may write is theirs to change: its keys replaced, its files swapped for links,
    and the restored gateway takes their token key (decision 0059). ``closed``: also
    refused when others may write it (a new backup's directory is closed after this)."""
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        raise InvalidRequest(f"{d} is not a corral backup (no such directory)",
                             hint="name the directory 'corral backup' wrote") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidRequest(f"{what} {d} is not a directory (a link, or a file)", hint="name a directory of yours")
    if st.st_uid not in (0, os.geteuid()) or (closed and st.st_mode & 0o022):
        raise InvalidRequest(f"{what} {d} is uid {st.st_uid}'s, mode {st.st_mode & 0o777:o}: another user could "
                             "change the keys in it", hint="name a directory only you may write (yours, mode 0700)")


def _copy(src: Path, dst: Path, new: bool = True) -> None:
    """Neither end through a link, and the copy 0600 from its first byte (never readable
    by others between its creation and a chmod). ``new``: the copy is a new file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_EXCL if new else os.O_TRUNC)
    with open(os.open(src, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f, open(os.open(dst, flags, 0o600), "wb") as out:
        os.fchmod(out.fileno(), 0o600)
        shutil.copyfileobj(f, out)


def _store_out(settings: Settings, dest: Path) -> dict[str, Any]:
    """The store, online: -> its part of the manifest (dialect, schema, audit head)."""
    if settings.replicated:
        return _pg_dump(settings.store_url, dest / "store.pgdump")
    src = sqlite3.connect(str(settings.db_path), timeout=30)
    os.close(os.open(dest / "corral.db", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    out = sqlite3.connect(str(dest / "corral.db"))
    try:
        src.backup(out, pages=4096, sleep=0.01)  # steps, so the gateway's writers wait briefly each time
        schema = int(out.execute("PRAGMA user_version").fetchone()[0])
        row = out.execute("SELECT seq, mac FROM audit_head WHERE id=1").fetchone() if schema >= 3 else None
    finally:
        src.close()
        out.close()
    os.chmod(dest / "corral.db", 0o600)
    return {"store": "sqlite", "schema": schema, "audit_head": list(row) if row else None}


def _pg_tool(name: str) -> str:
    found = shutil.which(name) or next((str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
                                                               reverse=True)), None)
    if not found:
        raise InvalidRequest(f"{name} is not installed here; a PostgreSQL store is backed up and restored with it",
                             hint="install the PostgreSQL client (Debian: postgresql-client) of the server's version")
    return found


def _pg_dump(url: str, out: Path) -> dict[str, Any]:
    db = open_store(url)  # also checks the schema is this corral's (migrated, or refused if newer)
    try:
        schema = db.version
    finally:
        db.close()
    r = proc.run([_pg_tool("pg_dump"), "--format=custom", "--no-owner", "--file", str(out), url], timeout=3600,
                 check=False)
    if r.returncode != 0:
        raise InvalidRequest(f"pg_dump failed: {r.stderr.strip()[-400:]}", hint="check [store] url and that the server is up")
    os.chmod(out, 0o600)
    db = open_store(url)
    try:  # read after the dump, before the audit is copied: the copy reaches it
        head = db.audit_head()
    finally:
        db.close()
    return {"store": "postgresql", "schema": schema, "audit_head": list(head) if head else None}


def _audit_out(home: Path, dest: Path) -> list[str]:
    """The chain's files, whole records only. A segment closed while copying (the live
    file renamed) is copied again: the listing is taken until it holds still."""
    for _ in range(10):
        before = _audit_listing(home)
        for old in dest.iterdir():
            old.unlink()
        for path in before:
            _copy_whole_records(path, dest / path.name)
        if _audit_listing(home) == before:
            return [p.name for p in before]
    raise InvalidRequest("the audit log kept rotating while it was copied", hint="run the backup again")


def _audit_listing(home: Path) -> list[Path]:
    closed = sorted(home.glob("audit-[0-9]*.jsonl"))
    return closed + ([home / "audit.jsonl"] if (home / "audit.jsonl").exists() else [])


def _copy_whole_records(src: Path, dst: Path) -> None:
    with open(src, "rb") as f:
        data = f.read()
    cut = data.rfind(b"\n") + 1  # a record being appended now is the next backup's
    with open(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        out.write(data[:cut])
        out.flush()
        os.fsync(out.fileno())


# -- restore -----------------------------------------------------------------------------


def read_manifest(src: Path) -> dict[str, Any]:
    """The backup's manifest, its files checked against their digests."""
    try:
        manifest: dict[str, Any] = json.loads((src / "manifest.json").read_text())
    except (OSError, ValueError):
        raise InvalidRequest(f"{src} is not a corral backup (no readable manifest.json)",
                             hint="name the directory 'corral backup' wrote") from None
    if manifest.get("format") != FORMAT:
        raise InvalidRequest(f"{src} is a backup of format {manifest.get('format')!r}; this corral reads format {FORMAT}",
                             hint="restore it with the corral version that wrote it")
    if int(manifest.get("schema", 0)) > len(MIGRATIONS):
        raise InvalidRequest(
            f"the backup's store is at schema version {manifest['schema']}, newer than this corral's {len(MIGRATIONS)} "
            f"(written by corral {manifest.get('corral')})", hint="restore it with that corral version or a newer one")
    for name, want in manifest.get("files", {}).items():
        path = src / name
        if not path.is_file() or _digest(path) != want["sha256"]:
            raise InvalidRequest(f"the backup's {name} is missing or changed since it was written",
                                 hint="restore from an intact copy of the backup")
    return manifest


def _refuse_live(settings: Settings) -> None:
    home = settings.home
    lock = home / "gateway.lock"
    if lock.exists():
        with open(lock, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InvalidRequest(f"a gateway is running on {home}: a restore would replace its state under it",
                                     hint="stop the gateway (systemctl stop corral-gateway), then restore onto a fresh home") from None
    held = [name for name in HELD if (home / name).exists()] + [p.name for p in home.glob("audit-[0-9]*.jsonl")]
    if held:
        raise InvalidRequest(f"{home} already holds a gateway's state ({', '.join(held)}): restoring over it would mix "
                             "two audit chains and two stores", hint=f"move {home} aside and restore onto a fresh home")


def restore(settings: Settings, src: Path) -> dict[str, Any]:
    """Put the backup at ``src`` on the fresh home of ``settings``; -> what was done."""
    from corral.safety.audit import AuditLog

    _private(src, "the backup")
    _private(src / "audit", "the backup's audit directory")
    manifest = read_manifest(src)
    target_pg = settings.replicated
    if (manifest["store"] == "postgresql") != target_pg:
        raise InvalidRequest(f"the backup's store is {manifest['store']}, this gateway's is "
                             f"{'postgresql' if target_pg else 'sqlite'}",
                             hint="set [store] url to an empty PostgreSQL database" if not target_pg
                             else "restore a PostgreSQL backup into [store] url; a SQLite one without it")
    _refuse_live(settings)
    if target_pg:
        _refuse_filled_pg(settings.store_url)
    head = tuple(manifest["audit_head"]) if manifest.get("audit_head") else None
    n, problems = AuditLog(src / "audit" / "audit.jsonl", src / "audit.key", head).verify(head)
    if problems:
        raise InvalidRequest(f"the backup's audit chain does not verify: {problems[0].file} line {problems[0].line}: "
                             f"{problems[0].what}", hint="restore from an intact backup")
    home = settings.home
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in (*SECRETS, *STATE):
        if (src / name).is_file():
            _copy(src / name, home / name, new=False)
    for name in manifest.get("audit_files", []):
        if not re.fullmatch(r"audit(-[0-9]+)?\.jsonl", str(name)):  # a name, never a path out of the home
            raise InvalidRequest(f"the backup's manifest names an audit file {name!r}", hint="restore an intact backup")
        _copy(src / "audit" / name, home / name, new=False)
    if target_pg:
        _pg_restore(src / "store.pgdump", settings.store_url)
    else:
        _copy(src / "corral.db", settings.db_path, new=False)
    db = open_store(settings.store_url)  # brings the schema up to this corral's
    try:
        schema = db.version
    finally:
        db.close()
    return {"restored": str(home), "from": str(src), "store": manifest["store"],
            "schema": {"backup": manifest["schema"], "now": schema}, "audit_records": n,
            "audit_head": head[0] if head else 0, "backup_created": manifest.get("created")}


def _refuse_filled_pg(url: str) -> None:
    from corral.core.store.conn import Conn

    conn = Conn(url)
    try:
        n = conn.one("SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()")[0]
    finally:
        conn.close()
    if n:
        raise InvalidRequest(f"the PostgreSQL store at [store] url already holds {n} tables: a restore would mix two "
                             "stores", hint="restore into an empty database (createdb), then point [store] url at it")


def _pg_restore(dump: Path, url: str) -> None:
    if not is_postgres(url):  # pragma: no cover - the caller checked
        raise InvalidRequest("not a PostgreSQL store")
    r = proc.run([_pg_tool("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error", "--dbname", url,
                  str(dump)], timeout=3600, check=False)
    if r.returncode != 0:
        raise InvalidRequest(f"pg_restore failed: {r.stderr.strip()[-400:]}", hint="restore into an empty database")
