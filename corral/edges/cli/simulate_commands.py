"""``corral simulate``: what agents, and corral, do to a facility, before it acts.

Runs on files only (no gateway); ``corral simulate calibrate`` measures the
controller's service times on a real Slurm (SLURM_CONF).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from corral.core.errors import InvalidRequest
from corral.simulate.engine import ALGORITHMS, SchedConfig
from corral.simulate.policies import POLICIES
from corral.simulate.workload import AgentModel, PeopleModel

SWEEP_DEFAULT = "0.1,0.2,0.3,0.4,0.5,0.6"


def _shares(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidRequest(f"--sweep {text!r} is not a list of shares", hint=f"e.g. --sweep {SWEEP_DEFAULT}") from None
    if not out or any(not 0 <= s < 1 for s in out):
        raise InvalidRequest("--sweep shares must be from 0 to below 1", hint=f"e.g. --sweep {SWEEP_DEFAULT}")
    return out


def _json_errors(ctx: click.Context) -> None:
    root = ctx.find_root().obj
    if root is not None and hasattr(root, "as_json"):
        root.as_json = True


@click.group(invoke_without_command=True)
@click.option("--trace", type=click.Path(path_type=Path),
              help="People's jobs from this SWF trace (.swf, .swf.gz); default: the generator.")
@click.option("--facility", help="A preset (2000-node, small) or a TOML file of [[partition]] tables "
                                 "(default: 2000-node; with --trace, the trace's own machine).")
@click.option("--days", type=float, default=30.0, show_default=True, help="Simulated days (generator only).")
@click.option("--seed", type=int, default=1, show_default=True, help="Same seed, same report.")
@click.option("--people", type=int, default=400, show_default=True, help="People (generator only).")
@click.option("--load", type=float, default=0.6, show_default=True,
              help="People's offered load, a share of the batch partition (generator only).")
@click.option("--agent-share", type=float, default=0.195, show_default=True, help="Agents' share of users.")
@click.option("--agent-loops", type=float, default=25.0, show_default=True, help="Mean jobs per agent session.")
@click.option("--agent-think", type=float, default=45.0, show_default=True,
              help="Median seconds from a result to an agent's next submission.")
@click.option("--agent-poll", type=float, default=2.0, show_default=True,
              help="Seconds between an agent's squeue polls outside corral.")
@click.option("--scheduler", type=click.Choice(ALGORITHMS), default="easy", show_default=True,
              help="fcfs, easy (EASY backfill, Slurm's way) or accasim-easy (AccaSim 1.1.3's variant).")
@click.option("--backfill-interval", type=float, default=30.0, show_default=True,
              help="Seconds between backfill passes (0: at every event, as AccaSim does).")
@click.option("--backfill-depth", type=int, default=500, show_default=True, help="Jobs a backfill pass looks at.")
@click.option("--policies", "policy_names", default=",".join(POLICIES), show_default=True,
              help="Which of plain, corral (the gateway today), corral-new (with the co-design levers), ban.")
@click.option("--cedar", type=click.Path(path_type=Path), help="The facility's Cedar policy (default: corral's).")
@click.option("--corral-without", "corral_without", default="",
              help="Run corral without some of its parts, to see what each buys: view, fast, cache, policy, nice, "
                   "and corral-new's levers preempt, predict, cap, order.")
@click.option("--guarantee", type=float, default=0.0, show_default=True,
              help="corral-new: share of a partition's cores agents' jobs get without preemption.")
@click.option("--reserve", type=float, default=0.01, show_default=True,
              help="corral-new: share of a partition's cores preemptible jobs leave idle for people's next jobs.")
@click.option("--walltime-margin", type=float, default=2.0, show_default=True,
              help="corral-new: the walltime asked is the predicted runtime times this.")
@click.option("--agent-tier", type=int, default=0, show_default=True,
              help="QOS tier of agents' batch jobs through corral: 0 people's, 1 a lower QOS (slurm.agent_qos).")
@click.option("--sweep", "sweep_text", default=None, is_flag=False, flag_value=SWEEP_DEFAULT,
              help=f"Also sweep the agents' share (the policies compared); alone: {SWEEP_DEFAULT}.")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="slurmctld's service times as `corral simulate calibrate` wrote them "
                   "(default: those measured on corral's private Slurm).")
@click.option("--html", "html_out", type=click.Path(path_type=Path), help="Also write a self-contained HTML report.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.pass_context
def simulate(ctx: click.Context, trace: Path | None, facility: str | None, days: float, seed: int, people: int,
             load: float, agent_share: float, agent_loops: float, agent_think: float, agent_poll: float,
             scheduler: str, backfill_interval: float, backfill_depth: int, policy_names: str, cedar: Path | None,
             corral_without: str, guarantee: float, reserve: float, walltime_margin: float, agent_tier: int,
             sweep_text: str | None, calibration: Path | None, html_out: Path | None, as_json: bool) -> None:
    """Simulate a facility with agents as ordinary users, through corral, and banned.

    \b
    The same people's jobs run under each policy: agents as ordinary users (each polls
    squeue, tiny jobs wait in the queue), agents through corral as the gateway is today
    (one shared view, the fast lane, agents' nice, the Cedar policy, the result cache),
    corral-new (the same, with agents' work beyond a guaranteed share preemptible,
    walltimes from outcome memory, a size cap that follows people's demand, the
    smallest opportunistic jobs first), and no
    agents. Reported per policy: people's wait, agents' loop latency and results per
    hour, utilisation and work lost to requeues, the controller's RPC rate and load.

    \b
    Examples:
      corral simulate                                   # a 2,000-node month, agents 19.5% of users
      corral simulate --agent-share 0.5 --html sim.html
      corral simulate --trace lublin_256.swf --scheduler fcfs --json
      corral simulate --sweep --days 7 --html sweep.html
      corral simulate calibrate                         # your slurmctld's service times
      corral simulate --calibration calibration.json    # ... used
    """
    if ctx.invoked_subcommand is not None:
        return
    if as_json:
        _json_errors(ctx)
    from rich.console import Console

    from corral.simulate import report, scenario

    names = tuple(n.strip() for n in policy_names.split(",") if n.strip())
    bad = [n for n in names if n not in POLICIES]
    if bad or not names:
        raise InvalidRequest(f"unknown policy {', '.join(bad) or '(none)'}", hint=f"use some of {', '.join(POLICIES)}")
    shares = _shares(sweep_text) if sweep_text else None
    if backfill_depth < 1:
        raise InvalidRequest("--backfill-depth must be at least 1")
    from corral.simulate.controlplane import ServiceTimes

    times = ServiceTimes.load(calibration) if calibration else None
    agents = AgentModel(share=agent_share, loops=agent_loops, think_s=agent_think, poll_s=agent_poll)
    sc = scenario.build(trace, facility, days, seed, agents, PeopleModel(people=people, load=load),
                        SchedConfig(scheduler, backfill_interval, backfill_depth), times, cedar=cedar, agent_tier=agent_tier,
                        corral_off=frozenset(x.strip() for x in corral_without.split(",") if x.strip()),
                        guarantee=guarantee, reserve=reserve, margin=walltime_margin)
    err = Console(stderr=True)
    show = sys.stderr.isatty() and not as_json
    result = _with_progress(err, show, sc, names, shares)
    if html_out:
        try:
            html_out.write_text(report.html_page(result))
        except OSError as e:
            raise InvalidRequest(f"cannot write {html_out}: {e.strerror}") from None
    if as_json:
        click.echo(report.to_json(result))
    else:
        report.terminal(result)
        if html_out:
            click.echo(f"HTML report: {html_out}")


def _with_progress(err: Any, show: bool, sc: Any, names: tuple[str, ...], shares: list[float] | None) -> dict[str, Any]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from corral.simulate import scenario

    total = sc.days * 86400
    runs = len(names) + (len(shares) * len(names) if shares else 0)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("day {task.fields[day]:.0f}"),
                  TimeElapsedColumn(), console=err, disable=not show, transient=True) as bar:
        task = bar.add_task("simulating", total=runs * total, day=0)
        names_seen: list[str] = []

        def tick(name: str, t: float) -> None:
            if not names_seen or names_seen[-1] != name:
                names_seen.append(name)
            bar.update(task, completed=(len(names_seen) - 1) * total + min(t, total), day=t / 86400,
                       description=f"simulating {name}")

        result = scenario.compare(sc, names, tick)
        if shares:
            from corral.simulate.caveats import of_sweep

            result["sweep"] = scenario.sweep(sc, shares, names, progress=tick)
            result["warnings"] = result.get("warnings", []) + of_sweep(result["sweep"])
    return result


@simulate.command()
@click.option("--queries", type=click.IntRange(min=10), default=200, show_default=True, help="squeue calls per step.")
@click.option("--held", type=click.IntRange(min=10), default=300, show_default=True, help="Jobs held for the slope.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("calibration.json"),
              show_default=True, help="Where to write them.")
def calibrate(queries: int, held: int, out: Path) -> None:
    """Measure your slurmctld's service times, for `corral simulate --calibration`.

    \b
    Each step is timed by slurmctld itself, from sdiag's counters read before and after
    it (never reset: a shared controller's statistics are left as they are): squeue with
    the queue empty, HELD jobs submitted held (sbatch --hold, cancelled at the end),
    squeue and squeue -j with them queued, their scancel, and 8 clients at once. Run it
    on a quiet controller (others' RPCs count too: others_rpcs says how many); SLURM_CONF
    names which.
    """
    from corral.simulate import calibrate as cal

    result = cal.calibrate(queries, held, say=lambda s: click.echo(s, err=True))
    path = cal.write(result, out)
    click.echo(f"wrote {path}")
    for k, v in result.items():
        click.echo(f"  {k}: {v}")
