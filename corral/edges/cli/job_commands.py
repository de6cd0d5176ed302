"""`corral control` and `corral usage`: a job after its submission (hold, release,
requeue, signal) and what it used once ended, as `seff` reports it; and what `corral
submit`, `status` and `jobs` share: their flags, lines and tables."""

from __future__ import annotations

from typing import Any, Callable

import click

from corral.edges.cli.kit import Ctx, fail, table, ts
from corral.core.signals import SIGNALS
from corral.edges import acts, reads


def job_line(j: dict[str, Any]) -> str:
    """One job as `corral status` says it: state, exit, requeues and why."""
    extra = f" exit={j['exit_code']}" if j.get("exit_code") is not None else ""
    if j.get("requeues"):  # Slurm preempted and requeued it; ran again from the start
        lost = f", {j['lost_s']:.0f} s of work lost" if j.get("lost_s") is not None else ""
        extra += f" requeued={j['requeues']}{lost}"
    reason = f" ({j['reason']})" if j.get("reason") else ""
    return f"job {j['id']}: {j['state']}{extra}{reason}"


def job_rows(jobs: list[dict[str, Any]]) -> str:
    """Jobs as `corral jobs` tables them."""
    rows = [{**j, "submitted": ts(j.get("submit_time")), "exit": j.get("exit_code"),
             "requeued": (f"{j['requeues']}x" + (f" ({j['lost_s']:.0f}s lost)" if j.get("lost_s") is not None else "")
                          if j.get("requeues") else "")} for j in jobs]
    # A job Slurm requeued (preempted) ran again from the start: the column only when one did.
    cols = ["id", "name", "principal", "session", "state", "exit", "submitted", "reason"]
    if any(j.get("cluster") not in (None, "local", "slurm") for j in jobs):  # several clusters: each job's
        cols.insert(5, "cluster")
    return table(rows, cols[:6] + ["requeued"] + cols[6:] if any(j.get("requeues") for j in jobs) else cols)


def parse_kv(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    """--env/--label KEY=VALUE pairs; exit 2 naming the one that is not."""
    out: dict[str, str] = {}
    for p in pairs:
        if "=" not in p:
            fail(f"{what} {p!r} must look like KEY=VALUE")
        k, v = p.split("=", 1)
        out[k] = v
    return out


def notice_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """`corral submit`'s --signal and --tier, as HTTP, MCP and the sbatch shim take them
    (JobSpec's ``signal`` and ``tier``): checked by the gateway, whose refusal is exit 2."""
    f = click.option("--tier", metavar="guaranteed|opportunistic", help="An agent's batch job on Slurm: 'guaranteed' (never preempted; refused, with "
                     "the nearest request, when agents' guaranteed share is full) or 'opportunistic' (preemptible, "
                     "requeued when a person needs the cores). Default: guaranteed while the share has room. "
                     "Lanes without tiers (local, fast) accept it and never preempt.")(f)
    return click.option("--signal", metavar="[B:]SIG[@SECONDS]", help="Slurm's --signal, [B:]SIG[@SECONDS]: send SIG (USR1, USR2, HUP, INT or "
                        "QUIT) SECONDS before the walltime ends (60 without @), and at once on a preemption, e.g. "
                        "--signal USR1@120 to checkpoint in a 'trap ... USR1'. Not on the fast lane.")(f)


@click.command()
@click.argument("job_id", type=int)
@click.argument("action", type=click.Choice(["hold", "release", "requeue", "signal"]))
@click.option("--signal", "-s", "sig", type=click.Choice(SIGNALS, case_sensitive=False),
              help="With 'signal': which one (e.g. USR1 to make a job checkpoint).")
@click.pass_obj
def control(o: Ctx, job_id: int, action: str, sig: str | None) -> None:
    """Hold, release, requeue or signal a job, where its lane can.

    \b
    Examples:
      corral control 42 hold            # keep a pending job from starting
      corral control 42 release
      corral control 42 signal -s USR1  # a running job: checkpoint now
      corral control 42 requeue         # Slurm: run it again from the start

    A refusal says what to do instead (a fast-lane task can only be cancelled).
    """
    if action == "signal" and not sig:
        raise click.UsageError("signal needs --signal, e.g. --signal USR1")
    job = o.client.run(acts.control, job_id, action, sig.upper() if sig else None)
    o.out(job, lambda j: f"job {j['id']}: {action} done ({j['state']}{', ' + j['reason'] if j.get('reason') else ''})")


@click.command()
@click.argument("job_id", type=int)
@click.pass_obj
def usage(o: Ctx, job_id: int) -> None:
    """What a finished job used against what it asked (elapsed, CPU time, peak memory,
    efficiencies, as seff reports them), and what to ask next time.

    \b
    Example:
      corral usage 7            # after 'corral wait 7'
    """

    o.out(o.client.run(reads.usage, job_id), usage_text)


def usage_text(u: dict[str, Any]) -> str:
    """`corral usage` for a person: each use against what was asked, in words that stay
    true when a job used more than it asked (its memory, before the limit caught it)."""
    a, eff = u["asked"], u["efficiency"]
    lines = [f"job {u['job_id']}: {u['state']}",
             f"  elapsed   {u['elapsed_s']} s of {a['walltime_s']} s asked" + _share(eff.get("time"), "of the time used"),
             f"  cpu time  {u['cpu_s']} s on {a['cpus']} CPUs" + _share(eff.get("cpu"), "CPU efficiency"),
             f"  peak mem  {u['max_rss_mb']} MB, {a['memory_mb']} MB asked" + _share(eff.get("memory"), "of it used"),
             f"  ({u['how']})"]
    return "\n".join(lines + [f"advice: {x}" for x in u["advice"]])


def _share(x: float | None, words: str) -> str:
    if x is None:
        return ""
    if x > 1:
        return f"  ({x:.0%}: more than asked)"
    return f"  ({x:.0%} {words})"


@click.command()
@click.argument("command", nargs=-1, required=True)
@click.option("--cpus", type=int, help="CPU cores.")
@click.option("--memory", "--mem", help="Memory, e.g. 4G.")
@click.option("--gpus", type=int, help="GPUs.")
@click.option("--walltime", "--time", "-t", help="Time limit with its unit, e.g. 30m, 2h.")
@click.option("--partition", "-p", help="Partition.")
@click.option("--cluster", help="A cluster's name, or 'auto' (the default): where the facility's objective puts it.")
@click.pass_obj
def plan(o: Ctx, command: tuple[str, ...], **res: Any) -> None:
    """What submitting this job would do, without submitting it: the verdict, its lane,
    and at a facility of several clusters every cluster and partition ranked (Slurm's
    start estimate, the SUs, and why one does not fit).

    \b
    Examples:
      corral plan --cpus 4 -t 2h -- python train.py
      corral plan --cluster gpu --gpus 1 -- python train.py
    """
    import os
    import shlex

    spec: dict[str, Any] = {k: v for k, v in res.items() if v is not None}
    spec["command"] = command[0] if len(command) == 1 else shlex.join(command)
    spec["workdir"] = os.getcwd()
    o.out(o.client.run(acts.plan, spec), _plan_text)


def _plan_text(r: dict[str, Any]) -> str:
    lines = [("would be allowed" if r["allowed"] else f"would be refused: {r['refused']['message']}")
             + (f" (lane {r['lane']})" if r.get("lane") else "")]
    for c in r.get("clusters") or []:
        where = f"{c['cluster']}/{c['partition']}"
        if c["fits"]:
            lines.append(f"  {where}: starts in {c['wait_s']:.0f} s, {c['sus']:g} SUs"
                         + (f" + {c['expected_loss_sus']:g} expected lost to preemption" if c.get("expected_loss_sus")
                            else "") + ("" if c["submit_would_use"] else " (name the partition to use it)"))
        else:
            near = ", ".join(f"{k}={v}" for k, v in (c.get("nearest") or {}).items() if k != "cluster")
            lines.append(f"  {where}: does not fit: {'; '.join(c['reasons'])}" + (f" (fits there: {near})" if near else ""))
    return "\n".join(lines)
