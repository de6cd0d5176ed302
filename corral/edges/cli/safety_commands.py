"""``corral risk``: tag commands an admin has (their users' shell history, job scripts)
and give the facility policy's decision on an agent running each."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import click



@click.command()
@click.option("--script", "script", type=click.File("r"), help="Tag one whole job script instead of lines on stdin.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per input line (for scripts).")
@click.option("--policy", "policy_file", type=click.Path(exists=True, dir_okay=False),
              help="Decide with this Cedar policy instead of the packaged default.")
@click.pass_context
def risk(ctx: click.Context, script: TextIO | None, as_json: bool, policy_file: str | None) -> None:
    """Tag shell commands by what they risk, and give the policy's decision for an agent.

    \b
    Reads one command per line on standard input (or a whole script with --script).
    Tags: destructive_fs, recursive_permissions, fork_bomb, credential_read,
    exfiltration, cryptomining, privilege_escalation, heavy_compute,
    scheduler_polling, obfuscated. Decision: allow or deny, with the rule.

    \b
    Examples:
      history | sed 's/^ *[0-9]* *//' | corral risk --json > tagged.jsonl
      corral risk --script job.sh
    """
    as_json = as_json or bool(ctx.obj and getattr(ctx.obj, "as_json", False))
    from pathlib import Path

    from corral.safety.policy import Policy, agent_verdict  # here, not at the top: `corral risk --help` loads neither
    from corral.safety.risk import analyze

    policy = Policy.load(Path(policy_file)) if policy_file else None
    items = [script.read()] if script else (line.rstrip("\n") for line in sys.stdin)
    for cmd in items:
        if not cmd.strip():
            continue
        r = analyze(cmd)
        verdict = agent_verdict(list(r.tags), policy)
        out: dict[str, Any] = {"command": cmd, "tags": sorted(r.tags), **verdict.to_dict(), "evidence": r.tags}
        del out["errors"]
        if r.unparsed:
            out["note"] = "the shell parser could not read all of it; tagged from a simpler split"
        if as_json:
            click.echo(json.dumps(out))
        else:
            click.echo(f"{out['decision']:6}  {','.join(out['tags']) or '-':40}  {cmd[:100]}")
