"""``corral sandbox``: what the facility's sandbox is on this machine, and a way for an
admin to try a command inside it before an agent does. Offline: it builds the same
``Sandbox`` the gateway builds from corral.toml (corral/sandbox/bwrap.py), without the egress
proxy (``run`` has no way out, as a job with no allow-list)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from corral.core import proc
from corral.core.errors import CorralError

if TYPE_CHECKING:
    from corral.sandbox.bwrap import Sandbox


def _fail(message: str, hint: str | None = None) -> None:
    from corral.edges.cli.kit import fail  # the CLI's one way to stop with a message (exit 2)

    fail(message, hint=hint)


def _box() -> Sandbox:
    from corral.core.config import load_settings  # here: `corral sandbox --help` loads neither pydantic nor the sandbox
    from corral.sandbox.bwrap import build

    s = load_settings()
    sb = s.sandbox
    try:
        return build(sb.kinds or ["agent"], sb.hide, sb.network, sb.run_as, [s.home, s.db_path.parent], sb.pids_max)
    except CorralError as e:
        _fail(e.message, e.hint)
        raise


@click.group(help="""Show the facility's job sandbox, or try a command inside it.

\b
Examples:
  corral sandbox show                   # what an agent's job sees hidden, its network
  corral sandbox run -- ls -la ~/.ssh   # empty, as an agent's job sees it""")
def sandbox() -> None:
    pass


@sandbox.command("show", help="""The sandbox this machine builds from corral.toml: which kinds
it contains, what it hides, its network and process limit, and whether it can be built here
(the same probe the gateway runs at start).

\b
  corral sandbox show
  corral --json sandbox show | jq .hidden""")
@click.pass_context
def show(ctx: click.Context) -> None:
    from corral.core.config import load_settings

    box = _box()
    s = load_settings()
    hidden, homes = [str(p) for p in box.hide], [str(h) for h in box.homes]
    out = {"kinds": sorted(s.sandbox.kinds), "available": box.why_not is None, "why_not": box.why_not,
           "network": "host" if box.network else ("allow-list: " + ", ".join(s.sandbox.allow_hosts)
                                                  if s.sandbox.allow_hosts else "none"),
           "pids_max": box.pids_max, "run_as": box.run_as, "own_process_count": box.own_count,
           "hidden": hidden, "homes_hidden_from_others": homes}
    if box.kinds and box.why_not is None:  # what a job in the current directory gets, as bwrap's steps
        kind = "agent" if box.applies("agent") else sorted(box.kinds)[0]
        out["profile"] = box.profile(kind, ["true"], os.getcwd())[0].describe()
    root = ctx.find_root().obj
    if getattr(root, "as_json", False):
        click.echo(json.dumps(out))
        return
    click.echo(f"kinds contained: {', '.join(sorted(s.sandbox.kinds)) or 'none (the sandbox is off)'}")
    click.echo(f"available here:  {'yes' if out['available'] else 'NO: ' + str(out['why_not'])}")
    click.echo(f"network:         {out['network']}")
    click.echo(f"processes:       at most {box.pids_max} per job"
               + ("" if box.own_count else " (counted per Unix user: user namespaces are off)"))
    click.echo("runs as:         under a root gateway, the principal's Unix user (an agent: its sponsor's), else a"
               f"\n                 dynamic uid of its own ([sandbox] dynamic_uids); 'corral sandbox run': {box.run_as}")
    click.echo("hidden:          " + ("\n                 ".join(hidden) or "-"))
    if homes:
        click.echo("homes, hidden from others' jobs: " + ", ".join(homes))


@sandbox.command("run", context_settings={"ignore_unknown_options": True}, help="""Run COMMAND
inside the sandbox an agent's job gets (kind agent), in a fresh working directory, as the
sandbox's run_as user (see 'corral sandbox show'), printing what it printed and exiting with
its exit code: what would an agent's job see, reach or break?

\b
  corral sandbox run -- ls -la ~/.ssh           (empty)
  corral sandbox run -- curl -m 3 https://pypi.org   (no network)
  corral sandbox run --workdir . -- make test""")
@click.option("--workdir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Run there (writable inside) instead of a fresh directory under /tmp.")
@click.option("--kind", default="agent", show_default=True, help="As a job of this kind of principal.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds before it is stopped.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(workdir: str | None, kind: str, timeout: float, command: tuple[str, ...]) -> None:
    box = _box()
    if box.why_not:
        _fail(f"this machine cannot build the sandbox: {box.why_not}")
    if not box.applies(kind):
        _fail(f"jobs of {kind} principals are not contained here ([sandbox] kinds)",
              hint="try --kind agent, or see 'corral sandbox show'")
    cwd = workdir or tempfile.mkdtemp(prefix="corral-sandbox-run-", dir="/tmp")
    if workdir is None:
        os.chmod(cwd, 0o777)  # the job's user (nobody under root) writes there
    try:
        r = proc.run(box.wrap(kind, list(command), str(Path(cwd).resolve())), timeout=timeout, check=False)
    except CorralError as e:
        _fail(e.message, e.hint)
        raise
    click.echo(r.stdout, nl=False)
    click.echo(r.stderr, nl=False, err=True)
    raise SystemExit(r.returncode)
