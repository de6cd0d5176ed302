"""``corral backup``, ``corral restore`` and ``corral migrate``: an admin's operations on a
gateway's state where it lies (corral/gateway/backup.py, corral/core/store/upgrade.py;
docs/deploy.md, "Operations")."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from corral.edges.cli.kit import Ctx, fail

_home = click.option("--home", type=click.Path(path_type=Path), help="The gateway's state directory (env CORRAL_HOME).")
_store = click.option("--store", "store_url", help="The store, when not the home's SQLite file nor [store] url: "
                      "postgresql://USER@HOST:PORT/DB.")


def _settings(home: Path | None, store_url: str | None) -> Any:
    from corral.core.config import load_settings
    from corral.core.errors import InvalidRequest

    try:
        return load_settings(home=home, store_url=store_url)
    except InvalidRequest as e:
        fail(e.message, 2, e.hint)


@click.command()
@click.argument("dest", type=click.Path(path_type=Path))
@_home
@_store
@click.pass_obj
def backup(o: Ctx, dest: Path, home: Path | None, store_url: str | None) -> None:
    """Back up a gateway's state (store, keys, identities, audit) while it serves.

    DEST is a new directory. The store (SQLite's online backup, or pg_dump), the keys and the admin's token, the
    identities (each principal's dynamic uid) and the whole audit chain, with a manifest
    of digests. Jobs' files, images and workspaces are not in it. DEST holds keys: keep it
    as you keep the gateway's home.

    \b
    Examples (on the gateway's host, as its service account or root):
      corral backup /srv/backup/corral-$(date +%F) --home /var/lib/corral
      corral --json backup /srv/backup/corral-today      # {"schema", "audit_head", "files", ...}
    """
    from corral.gateway.backup import backup as run

    manifest = run(_settings(home, store_url), dest)
    o.out(manifest, lambda m: f"backed up {m['home']} to {dest}: store {m['store']} at schema {m['schema']}, "
                              f"audit head {(m['audit_head'] or [0])[0]}, {len(m['files'])} files in {m['took_s']} s")


@click.command()
@click.argument("src", type=click.Path(path_type=Path))
@_home
@_store
@click.pass_obj
def restore(o: Ctx, src: Path, home: Path | None, store_url: str | None) -> None:
    """Restore a backup onto a fresh home, its audit chain verified first.

    SRC is what 'corral backup' wrote; the home must be fresh (and the store empty). The
    schema is then brought up to this corral's.

    Refused (exit 2): a home a gateway runs on or that holds a gateway's state, a store
    that is not empty, a backup of a newer corral's schema, a backup whose files or audit
    chain do not verify. Start the gateway afterwards: it reconciles the jobs the backup
    knew with what Slurm says now.

    \b
    Examples:
      corral restore /srv/backup/corral-2026-12-07 --home /var/lib/corral
      corral audit verify --home /var/lib/corral          # then: systemctl start corral-gateway
    """
    from corral.gateway.backup import restore as run

    done = run(_settings(home, store_url), src)
    o.out(done, lambda d: f"restored {d['from']} onto {d['restored']}: schema {d['schema']['backup']} -> "
                          f"{d['schema']['now']}, audit chain verified ({d['audit_records']:,} records)")


@click.command()
@click.option("--check", is_flag=True, help="Only say what would run: exit 0 if nothing, 1 if a migration is needed.")
@_home
@_store
@click.pass_obj
def migrate(o: Ctx, check: bool, home: Path | None, store_url: str | None) -> None:
    """Bring the store's schema up to this corral's; --check says what would run.

    The gateway also migrates at start.
    With --check, nothing is changed: it says the store's version, this corral's, and
    each migration that would run; exit 1 when one would, 0 when none, 2 for a store of a
    newer corral (never migrated down). Back up first (corral backup) and stop the gateway.

    \b
    Examples:
      corral migrate --check --home /var/lib/corral      # after installing a new corral, before starting it
      corral migrate --home /var/lib/corral
    """
    from corral.core.store.conn import Conn, is_postgres
    from corral.core.store.upgrade import plan

    settings = _settings(home, store_url)
    url = settings.store_url
    if not is_postgres(url) and not Path(url).exists():
        fail(f"no store at {url}", 2, "pass --home naming the gateway's state directory, or --store")
    if not check:
        _refuse_running(settings)
    conn = Conn(url)
    try:
        before = plan(conn)
    finally:
        conn.close()
    if before.newer:
        fail(f"the store is at schema version {before.current}, newer than this corral's {before.latest}", 2,
             "install that corral version (or newer); a store is never migrated down")
    if check:
        o.out(before.to_dict(), _said)
        sys.exit(1 if before.needed else 0)
    from corral.core.store import open_store

    open_store(url).close()
    o.out({**before.to_dict(), "ran": True}, lambda d: _said(d, "ran") + ("\nmigrated: the store is at version "
                                                                          f"{d['latest']}" if d["needed"] else ""))


def _said(d: dict[str, Any], verb: str = "would run") -> str:
    lines = [f"store schema: version {d['current']}; this corral's: {d['latest']}"]
    lines += [f"  {verb} {m['version']}: {m['what']}" for m in d["pending"]]
    lines += [f"  {'repaired' if verb == 'ran' else 'would repair'}: {r} (an early migration 3's store)" for r in d["repairs"]]
    if verb != "ran":
        lines.append("a migration is needed" if d["needed"] else "up to date: nothing to run")
    return "\n".join(lines)


def _refuse_running(settings: Any) -> None:
    import fcntl

    lock = settings.home / "gateway.lock"
    if settings.replicated or not lock.exists():
        return
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fail(f"a gateway is running on {settings.home}", 2, "stop it first: a schema changed under it is not one it knows")
