"""``corral sponsor``: a sponsor's own view of the agents they answer for (issue 51)."""

from __future__ import annotations

from typing import Any

import click

from corral.edges.cli.kit import Ctx, table
from corral.edges import reads


def _show(r: dict[str, Any]) -> str:
    rows = [{"agent": a["agent"],
             "jobs": sum(a["jobs"].values()),
             "completed": a["jobs"].get("COMPLETED", 0),
             "failed": sum(a["jobs"].get(s, 0) for s in ("FAILED", "TIMEOUT", "OUT_OF_MEMORY")),
             "cpu_h": a["cpu_hours"],
             "refused": sum(x["count"] for x in a["refusals"]),
             "waiting": a["waiting"]} for a in r["agents"]]
    out = [f"{r['sponsor']}'s agents, last {r['days']:g} days:",
           table(rows, ["agent", "jobs", "completed", "failed", "cpu_h", "refused", "waiting"]) if rows
           else "(you sponsor no agent)"]
    refusals = [{"agent": a["agent"], **x} for a in r["agents"] for x in a["refusals"]]
    if refusals:
        out += ["", "Refused, by rule:", table(refusals, ["agent", "rule", "count", "last_reason"])]
    if r["approvals"]:
        out += ["", "Waiting for your answer (corral approvals approve|decline ID):",
                table([{**a, "jobs": ",".join(map(str, a["jobs"]))} for a in r["approvals"]],
                      ["id", "principal", "rule", "jobs", "summary"])]
    return "\n".join(out)


@click.command()
@click.option("--days", default=7.0, show_default=True, type=click.FloatRange(0, 366, min_open=True),
              help="How far back.")
@click.option("--for", "for_", metavar="SPONSOR", help="Another sponsor's view (admins).")
@click.pass_obj
def sponsor(o: Ctx, days: float, for_: str | None) -> None:
    """What the agents you answer for ran, used and were refused, and what waits for you.

    \b
    Examples:
      corral sponsor                 the last 7 days
      corral sponsor --days 1 --json
    """
    o.out(o.client.run(reads.sponsor, days=days, sponsor=for_), _show)
