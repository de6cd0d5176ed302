"""``corral approvals``: actions a facility rule says a sponsor must approve (issue 51)."""

from __future__ import annotations

import time
from typing import Any

import click

from corral.edges.cli.kit import Ctx, table
from corral.edges import acts, reads


@click.group()
def approvals() -> None:
    """Approve or decline what your agents asked to do where the facility's policy says a
    person must answer first (a rule with @ask("sponsor")).

    Until you answer, the agent's jobs wait (PENDING, with who must approve and until
    when as their reason); approved, they run; declined or expired, they end CANCELLED with
    your note as the reason. The agent is told either way.

    \b
    Examples:
      corral approvals list
      corral approvals approve 12
      corral approvals decline 12 --note "use 8 GPUs, not 64"
      corral approvals ahead claude-1 --session tour-1 --rule big-jobs-ask --for 4h
    """


def _when(t: float | None) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(t)) if t else "-"


@approvals.command("list")
@click.option("--state", type=click.Choice(["pending", "approved", "declined", "expired", "void", "all"]), default="pending",
              show_default=True, help="Which: waiting for an answer (pending), decided, expired, or all.")
@click.pass_obj
def approvals_list(o: Ctx, state: str) -> None:
    """What waits for you (or what was decided)."""
    def show(r: dict[str, Any]) -> str:
        rows = [{**a, "expires": _when(a["expires"]), "jobs": ",".join(map(str, a["jobs"])),
                 "summary": a["summary"][:60]} for a in r["approvals"]]
        return table(rows, ["id", "principal", "rule", "jobs", "state", "expires", "decided_by", "summary"]) \
            if rows else "nothing waits for you"
    o.out(o.client.run(reads.approvals, state=state), show)


@approvals.command("approve")
@click.argument("approval_id", type=int)
@click.option("--note", help="A word for the agent.")
@click.pass_obj
def approvals_approve(o: Ctx, approval_id: int, note: str | None) -> None:
    """Approve: the action's jobs are sent."""
    o.out(o.client.run(acts.approve, approval_id, note=note), lambda r: f"approved #{r['approval']}: jobs "
          f"{', '.join(map(str, r['jobs']))} are sent")


@approvals.command("decline")
@click.argument("approval_id", type=int)
@click.option("--note", help="Why (the agent reads it as its jobs' reason).")
@click.pass_obj
def approvals_decline(o: Ctx, approval_id: int, note: str | None) -> None:
    """Decline: the action's jobs end CANCELLED with your note."""
    o.out(o.client.run(acts.decline, approval_id, note=note), lambda r: f"declined #{r['approval']}: jobs "
          f"{', '.join(map(str, r['jobs']))} cancelled")


@approvals.command("ahead")
@click.argument("agent")
@click.option("--session", required=True, help="The agent's session it holds for.")
@click.option("--rule", required=True, help="The policy rule (one with @ask) to approve ahead.")
@click.option("--for", "for_", default="8h", show_default=True, help="How long.")
@click.pass_obj
def approvals_ahead(o: Ctx, agent: str, session: str, rule: str, for_: str) -> None:
    """Approve one rule ahead for one session of an agent you sponsor."""
    o.out(o.client.run(acts.approve_ahead, agent=agent, session=session, rule=rule, for_=for_),
          lambda r: f"{r['rule']} approved for {r['agent']}'s session {r['session']} until {_when(r['until'])}")
