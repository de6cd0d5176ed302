"""``corral saved``: what corral saved the scheduler, as the dashboard's panel and plot say
it (one function answers both: corral/gateway/board_figures.py)."""

from __future__ import annotations

from typing import Any

import click

from corral.edges.cli.kit import Ctx, table, ts
from corral.edges import reads


def _show(r: dict[str, Any]) -> str:
    out = []
    for b in r.get("backends") or []:
        rows = [{"calls": f"clients without corral would have asked ({b['jobs']} sbatch, {b['reads']} "
                          f"{'query' if b['reads'] == 1 else 'queries'}, {b['cancels']} scancel)",
                 "n": b["without_corral"]},
                {"calls": "corral asked the controller" + (
                    " (" + ", ".join(f"{n} {c}" for c, n in b["by_command"].items()) + ")" if b["by_command"]
                    else " (none here)"), "n": b["corral_asked"]}]
        out += [f"{b['backend']} backend" + (f": {b['ratio']}x fewer calls" if b.get("ratio") else ""),
                table(rows, ["calls", "n"]), b["means"], ""]
    out.append(f"fast-lane tasks {r['fast_lane_tasks']}, carried by {r['their_scheduler_jobs']} scheduler jobs")
    if r.get("over_time"):
        first, last = r["over_time"][0], r["over_time"][-1]
        out.append(f"since {ts(first['at'])} ({len(r['over_time'])} samples): clients would have asked "
                   f"{first['without_corral']} -> {last['without_corral']}, corral asked "
                   f"{first['corral_asked']} -> {last['corral_asked']}")
    return "\n".join(out)


@click.command()
@click.pass_obj
def saved(o: Ctx) -> None:
    """What corral saved the scheduler: the calls its clients would have made without it against those it made.

    \b
    Admins see the batch backend's calls (an sbatch per job, a query per read, an scancel
    per cancel, against the commands corral ran) and how both grew over the last half
    hour: the dashboard's panel and plot, from the same figures. A sponsor sees the
    fast-lane tasks of their own agents.

    \b
    Examples:
      corral saved
      corral saved --json | jq '.backends[0].ratio'
    """
    o.out(o.client.run(reads.saved), _show)
