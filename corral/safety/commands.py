"""``corral risk``: tag commands an admin has (their users' shell history, job scripts)."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import click

from .risk import analyze, decide


@click.command()
@click.option("--script", "script", type=click.File("r"), help="Tag one whole job script instead of lines on stdin.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per input line (for scripts).")
@click.pass_context
def risk(ctx: click.Context, script: TextIO | None, as_json: bool) -> None:
    """Tag shell commands by what they risk, and give the default decision for an agent.

    \b
    Reads one command per line on standard input (or a whole script with --script).
    Tags: destructive_fs, recursive_permissions, fork_bomb, credential_read,
    exfiltration, cryptomining, privilege_escalation, heavy_compute,
    scheduler_polling, obfuscated. Decision: deny, review or allow.

    \b
    Examples:
      history | sed 's/^ *[0-9]* *//' | corral risk --json > tagged.jsonl
      corral risk --script job.sh
    """
    as_json = as_json or bool(ctx.obj and getattr(ctx.obj, "as_json", False))
    items = [script.read()] if script else (line.rstrip("\n") for line in sys.stdin)
    for cmd in items:
        if not cmd.strip():
            continue
        r = analyze(cmd)
        decision, why = decide(r)
        out: dict[str, Any] = {"command": cmd, "tags": sorted(r.tags), "decision": decision, "because": why,
                               "evidence": r.tags}
        if r.unparsed:
            out["note"] = "the shell parser could not read all of it; tagged from a simpler split"
        if as_json:
            click.echo(json.dumps(out))
        else:
            click.echo(f"{decision:6}  {','.join(out['tags']) or '-':40}  {cmd[:100]}")
