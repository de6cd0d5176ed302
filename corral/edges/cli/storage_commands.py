"""`corral env` (environment images) and `corral workspace` (trial workspaces): thin
clients of /v1/env and /v1/workspaces. A build shows its steps as a progress bar."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import click

from corral.edges.cli.kit import Ctx, table, ts
from corral.core.errors import InvalidRequest
from corral.core.text import WS_ID as WS_ID_PATTERN
from corral.edges import acts, reads


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _image_line(r: dict[str, Any]) -> str:
    pk = r.get("packages") or []
    shown = ", ".join(pk[:6]) + (f" (+{len(pk) - 6})" if len(pk) > 6 else "")
    return (f"image {r['image']}{' (' + r['name'] + ')' if r.get('name') else ''}: {_size(r.get('size'))}, "
            f"python {r.get('python')}, {len(pk)} packages: {shown}\n"
            f"use it: corral submit --image {r.get('name') or r['image'][:12]} -- python ...")


@click.group()
def env() -> None:
    """Environment images: a Python environment built once with uv, packed into one
    read-only squashfs file, shared by every job and every principal.

    \b
    Examples:
      corral env build requirements.txt --name torch-cpu   # build (or reuse) an image
      corral submit --image torch-cpu -- python train.py   # its python first on PATH
      corral env list                                      # images, sizes, last use
      corral env status torch-cpu                          # a build's progress, or why it failed
      corral env gc --dry-run                              # admin: what is unused
    """


@env.command("build")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="A name jobs may use for the image (--image NAME).")
@click.option("--rebuild", is_flag=True, help="Build again even if the image exists (e.g. it is corrupt).")
@click.option("--no-wait", is_flag=True, help="Return once the build is queued; 'corral env status' follows it.")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="Longest wait for the build.")
@click.pass_obj
def env_build(o: Ctx, file: Path, name: str | None, rebuild: bool, no_wait: bool, timeout: float) -> None:
    """Build an image from a requirements.txt, a pyproject.toml or a uv.lock (the
    pyproject.toml beside it is sent too): packages of the facility's index only (no -r,
    -c, -e, --index-url, --find-links, paths or file: URLs). The install runs as your own
    job, in your sandbox. Asking again for the same file answers at once with the image
    you (or your identity) already built."""
    from corral.gateway.images import KINDS

    if file.name not in KINDS:
        raise InvalidRequest(f"{file.name} is not one of {', '.join(KINDS)}; rename it or point at the right file")
    files = {file.name: file.read_text()}
    if file.name == "uv.lock":
        project = file.with_name("pyproject.toml")
        if not project.exists():
            raise InvalidRequest(f"a uv.lock is built with its pyproject.toml, and {project} does not exist")
        files["pyproject.toml"] = project.read_text()
    r = o.client.run(acts.env_build, files, name, rebuild)
    if r["state"] == "building" and not no_wait:
        r = _follow(o, r, timeout)
    if r["state"] == "failed":
        raise InvalidRequest(f"the environment could not be built: {r.get('error')}",
                             hint="fix the file (the message names the package) and build again")
    o.out(r, _human_status)


def _follow(o: Ctx, r: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Poll the build until it ends, drawing its steps (to stderr, so --json stays one object)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    end = time.monotonic() + timeout
    with Progress(TextColumn("[bold]env build"), BarColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  transient=True, disable=o.as_json or not sys.stderr.isatty(),
                  console=__import__("rich.console").console.Console(stderr=True)) as bar:
        task = bar.add_task("queued", total=5)
        while r["state"] == "building" and time.monotonic() < end:
            p = r.get("progress") or {}
            bar.update(task, completed=max(0, p.get("step", 0) - 1), description=p.get("doing", "queued"))
            time.sleep(0.5)
            r = o.client.run(reads.env_status, r['digest'])
    return r


def _human_status(r: dict[str, Any]) -> str:
    if r["state"] == "ready":
        return ("reused: " if r.get("reused") else "") + _image_line(r)
    if r["state"] == "failed":
        return f"build failed: {r.get('error')}"
    p = r.get("progress") or {}
    return (f"building (job {r.get('job')}): step {p.get('step', 0)}/{p.get('of', 5)} {p.get('doing', '')}\n"
            f"follow it: corral env status {r['digest']}")


@env.command("status")
@click.argument("ref")
@click.pass_obj
def env_status(o: Ctx, ref: str) -> None:
    """A build (its digest) or an image (name or key): state, progress, or why it failed."""
    o.out(o.client.run(reads.env_status, ref), _human_status)


@env.command("list")
@click.pass_obj
def env_list(o: Ctx) -> None:
    """Every image: name, key, size, packages, who built it, when it was last used."""
    images = o.client.run(reads.env_list)["images"]
    rows = [{**i, "key": i["image"][:12], "size": _size(i["size"]), "packages": len(i["packages"]),
             "created": ts(i["created"]), "last_used": ts(i["last_used"])} for i in images]
    o.out(images, lambda _: table(rows, ["key", "name", "size", "python", "packages", "built_by", "created",
                                         "last_used"]))


@env.command("gc")
@click.option("--older-than", "days", type=float, help="Collect images unused for this many days (default: the facility's).")
@click.option("--image", help="Collect this one image (name or key).")
@click.option("--dry-run", is_flag=True, help="Say what would go; remove nothing.")
@click.pass_obj
def env_gc(o: Ctx, days: float | None, image: str | None, dry_run: bool) -> None:
    """Admin: remove images no job used recently (unmounted, files and records gone)."""
    r = o.client.run(acts.env_gc, days, image, dry_run)
    o.out(r, lambda x: f"{'would collect' if dry_run else 'collected'} {len(x['collected'])} image(s)"
          + "".join(f"\n  {k}" for k in x["collected"]))


@click.group()
def workspace() -> None:
    """Copy-on-write trial workspaces: fork a project, let jobs change it, then look at
    the diff and commit it back, or discard it. Twenty forks cost their changes, not
    twenty copies.

    \b
    Examples:
      corral workspace fork ~/proj                      # -> ws-0123abcd4567
      corral submit --workspace ws-0123abcd4567 -- pytest -x
      corral workspace diff ws-0123abcd4567             # what the trial changed
      corral workspace commit ws-0123abcd4567           # write it back (refused on conflict)
      corral workspace discard ws-0123abcd4567
      corral workspace list                             # yours, with their expiry
    """


@workspace.command("fork")
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--rev", help="Start from this git commit, branch or tag of BASE (a git repository).")
@click.pass_obj
def ws_fork(o: Ctx, base: Path, rev: str | None) -> None:
    """A new workspace over BASE (a directory, or a git repository at --rev)."""
    r = o.client.run(acts.ws_fork, str(base.resolve()), rev)
    o.out(r, lambda w: f"workspace {w['workspace']} over {w['base']}{' at ' + w['rev'] if w.get('rev') else ''} "
                       f"({w['how']})\n  path: {w['path']}\n  run in it: corral submit --workspace {w['workspace']} -- ...")


WS_ID = re.compile(WS_ID_PATTERN)


def _ws_id(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A workspace id checked here, in the reader's terms (the API's answer is a regex)."""
    for v in value if isinstance(value, tuple) else (value,):
        if not WS_ID.match(v):
            raise InvalidRequest(f"{v!r} is not a workspace id: ids look like ws-0123abcd4567",
                                 hint="'corral workspace list' shows yours; 'corral workspace fork DIR' makes one")
    return value


def _when(t: float | None) -> str:
    """A time of day today, else its date too: an expiry is days away."""
    if not t:
        return "-"
    same_day = time.strftime("%Y-%m-%d", time.localtime(t)) == time.strftime("%Y-%m-%d")
    return time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M", time.localtime(t))


@workspace.command("list")
@click.pass_obj
def ws_list(o: Ctx) -> None:
    """Your active workspaces."""
    ws = o.client.run(reads.ws_list)["workspaces"]
    rows = [{**w, "changes": _size(w["upper_bytes"]), "expires": _when(w["expires"])} for w in ws]
    o.out(ws, lambda _: table(rows, ["workspace", "base", "rev", "how", "changes", "expires"]))


@workspace.command("diff")
@click.argument("ws_id", callback=_ws_id)
@click.pass_obj
def ws_diff(o: Ctx, ws_id: str) -> None:
    """What the trial changed: added (A), modified (M) and deleted (D) files."""
    r = o.client.run(reads.ws_diff, ws_id)
    o.out(r, lambda d: "\n".join([f"{c} {p}" for c, k in (("A", "added"), ("M", "modified"), ("D", "deleted"))
                                  for p in d[k]]) or "(no changes)")


@workspace.command("commit")
@click.argument("ws_id", callback=_ws_id)
@click.pass_obj
def ws_commit(o: Ctx, ws_id: str) -> None:
    """Write the changed files back to the base; refused, naming the paths, if the base
    changed there since the fork. The workspace is gone afterwards."""
    r = o.client.run(acts.ws_commit, ws_id)
    o.out(r, lambda c: f"committed {ws_id}: {len(c['added'])} added, {len(c['modified'])} modified, "
                       f"{len(c['deleted'])} deleted")


@workspace.command("discard")
@click.argument("ws_ids", nargs=-1, required=True, callback=_ws_id)
@click.pass_obj
def ws_discard(o: Ctx, ws_ids: tuple[str, ...]) -> None:
    """Drop workspaces and everything their trials wrote (one id or several)."""
    done = [o.client.run(acts.ws_discard, ws_id) for ws_id in ws_ids]
    o.out(done if len(done) > 1 else done[0], lambda _: "\n".join(f"discarded {w}" for w in ws_ids))
