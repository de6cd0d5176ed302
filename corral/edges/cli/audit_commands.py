"""``corral audit verify|tail|search``: read the gateway's audit chain where it lies
($CORRAL_HOME), as an admin on the gateway's host."""

from __future__ import annotations

import json

from pathlib import Path
from typing import Any

import click

from corral.core.errors import InvalidRequest


def _open(home: Path | None) -> tuple[Any, tuple[int, str] | None]:
    from corral.core.config import load_settings
    from corral.core.db import Database
    from corral.safety.audit import AuditLog

    settings = load_settings(home=home) if home else load_settings()
    h = home or settings.home
    if not (h / "audit.key").exists():
        raise InvalidRequest(f"no audit log under {h}", hint="pass --home, or set CORRAL_HOME to the gateway's state directory")
    db = Database(settings.store_url if settings.store.url else h / "corral.db")
    try:
        head = db.audit_head()
    finally:
        db.close()
    return AuditLog(h / "audit.jsonl", h / "audit.key", head or (0, "")), head


@click.group()
def audit() -> None:
    """The audit chain: every decision (submit, cancel), allowed or refused, tamper-evident.

    \b
    Examples (on the gateway's host, as its admin):
      corral audit verify                                    # is the chain whole?
      corral audit tail -n 5                                 # the newest decisions
      corral audit search --principal bot --decision deny   # what an agent was refused
    """


_home = click.option("--home", type=click.Path(path_type=Path), help="Gateway state directory (default $CORRAL_HOME or ./.corral).")


@audit.command()
@_home
@click.pass_context
def verify(ctx: click.Context, home: Path | None) -> None:
    """Check the whole chain, every segment in order; say where and how it was edited,
    cut, reordered or extended."""
    log, head = _open(home)
    n, problems = log.verify(head)
    if getattr(ctx.obj, "as_json", False):  # the dashboard's audit figure, as scripts read it
        click.echo(json.dumps({"ok": not problems, "records": n, "head": head[0] if head else 0,
                               "problems": [{"file": p.file, "line": p.line, "seq": p.seq, "what": p.what}
                                            for p in problems]}))
        ctx.exit(1 if problems else 0)
    if problems:
        for p in problems:
            click.echo(f"{p.file + ', ' if p.file else ''}line {p.line} (record {p.seq}): {p.what}", err=True)
        ctx.exit(1)
    click.echo(f"ok: {n:,} records, chain intact up to record {head[0] if head else 0}")


@audit.command()
@_home
@click.option("-n", "count", type=int, default=20, show_default=True, help="How many of the newest records.")
def tail(home: Path | None, count: int) -> None:
    """The newest records, as JSON lines."""
    log, _ = _open(home)
    from collections import deque

    for r in deque(log.records(), maxlen=count):
        click.echo(json.dumps(r))


@audit.command()
@_home
@click.option("--principal", help="Only this principal's decisions.")
@click.option("--action", help="Only this action (submit, cancel).")
@click.option("--decision", type=click.Choice(["allow", "deny"]), help="Only allowed or only refused.")
@click.option("--job", "job_id", type=int, help="Only decisions about this job.")
def search(home: Path | None, principal: str | None, action: str | None, decision: str | None, job_id: int | None) -> None:
    """Matching records as JSON lines (all of them: this is also the export)."""
    log, _ = _open(home)
    for r in log.records():
        if ((principal and r.get("principal") != principal) or (action and r.get("action") != action)
                or (decision and r.get("decision") != decision) or (job_id is not None and r.get("job_id") != job_id)):
            continue
        click.echo(json.dumps(r))



