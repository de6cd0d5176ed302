"""``corral analyze`` and ``corral synth``: the analytics on the command line.

They read and write files only; no gateway is needed, so an admin can run them on
an accounting export anywhere.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from corral.core.errors import InvalidRequest
from corral.analytics import synth as synth_mod

PARAM_HELP = {
    "users": "Number of users.", "jobs": "Number of jobs.", "days": "Length of the period in days.",
    "start": "First day (YYYY-MM-DD).", "seed": "Random seed (same seed, same file).",
    "agent_users": "Agents' share of users.", "agent_jobs": "Agents' share of submissions.",
    "agent_cpu_hours": "Agents' share of CPU core-hours.", "agent_gpu_hours": "Agents' share of GPU-hours.",
    "rate_ratio": "Agents' submissions per active hour over humans'.",
    "agent_short": "Share of agents' jobs that end within a minute.", "agent_cancelled": "Share of agents' jobs cancelled.",
    "human_short": "Share of humans' jobs that end within a minute.", "human_cancelled": "Share of humans' jobs cancelled.",
    "human_rate": "A human's submissions per active hour.", "human_gpu_jobs": "Share of humans' longer jobs that use GPUs.",
    "agent_fail": "Chance an agent's job fails.", "human_fail": "Chance a human's job fails.",
    "agent_off_hours": "How busy agents are at night and on weekends against office hours (0.01 as idle as "
                       "people, 1 as busy as by day).",
}


def _stderr_is_tty() -> bool:
    return sys.stderr.isatty()


@click.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["sacct", "sacct-json", "swf", "csv", "corral", "audit"]),
              help="Input format (default: detected from the name and first bytes).")
@click.option("--overrides", type=click.Path(path_type=Path),
              help="File of 'USER agent|human' lines that settle who is an agent.")
@click.option("--labels", type=click.Path(path_type=Path),
              help="Ground truth 'user|kind' (as corral synth writes): report classification accuracy.")
@click.option("--classify/--no-classify", "behaviour", default=None,
              help="Classify users without provenance by behaviour (default: yes, except for SWF traces, "
                   "which predate coding agents).")
@click.option("--html", "html_out", type=click.Path(path_type=Path), help="Also write a self-contained HTML report here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--csv", "csv_dir", type=click.Path(path_type=Path),
              help="Also write every table (daily, weekly, by partition, account and size, distributions, users, "
                   "utilisation) as CSV files in this directory.")
@click.option("--capacity-cores", type=click.IntRange(min=1),
              help="The facility's cores, for use against capacity (an SWF trace's MaxProcs otherwise).")
@click.pass_context
def analyze(ctx: click.Context, file: Path, fmt: str | None, overrides: Path | None, labels: Path | None,
            behaviour: bool | None, html_out: Path | None, as_json: bool, csv_dir: Path | None,
            capacity_cores: int | None) -> None:
    """Measure what agents take of a facility, from its accounting data.

    \b
    FILE is one of (detected, or name it with --format):
      sacct        sacct --allusers --allocations --parsable2 --starttime 2026-01-01 \\
                     --format=JobID,User,Account,Partition,JobName,Submit,Start,End,ElapsedRaw,\\
                     State,ExitCode,AllocCPUS,AllocTRES,Comment
      sacct-json   sacct --allusers --allocations --json
      csv          a comma-separated export with a header (SubmitTime, WaitTime, RunTime, NCPUS ...)
      swf          a Standard Workload Format trace (.swf, .swf.gz)
      corral       a corral gateway's state database ($CORRAL_HOME/corral.db)
      audit        a corral gateway's audit chain ($CORRAL_HOME/audit.jsonl)

    \b
    Who is an agent: exact where jobs carry corral's provenance (kind=agent in the
    job comment), else a score over each user's behaviour (submission rate, night
    and weekend work, jobs under a minute, cancels), else your --overrides file.

    \b
    Examples:
      corral synth --out facility.txt && corral analyze facility.txt --labels facility.txt.labels
      corral analyze export.txt --json > report.json
      corral analyze export.txt --html report.html --overrides agents.txt
      corral analyze export.txt --csv tables/ --capacity-cores 4096
    """
    from rich.console import Console

    from corral.analytics.classify import classify, read_labels, read_overrides
    from corral.analytics.ingest import load
    from corral.analytics.render import html_page, terminal
    from corral.analytics.report import build

    as_json = as_json or bool(ctx.obj and getattr(ctx.obj, "as_json", False))
    root = ctx.find_root().obj
    if as_json and hasattr(root, "as_json"):
        root.as_json = True  # `analyze --json`'s errors are JSON too, as under `corral --json`
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # Polars reads the export in one call, so the bar moves by stage (read, classify,
    # build), each named; on a terminal only: a pipe and --json get nothing on stderr.
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                  disable=not _stderr_is_tty() or as_json) as bar:
        task = bar.add_task(f"reading {file}", total=3)
        ing = load(file, fmt)
        if behaviour is None:
            behaviour = ing.format != "swf"
            if not behaviour:
                ing.notes.append("SWF traces predate coding agents: users count as human unless the override "
                                 "file says otherwise (--classify runs the behaviour score instead)")
        bar.update(task, advance=1, description=f"classifying {ing.jobs.height:,} jobs' users")
        ov = read_overrides(overrides) if overrides else None
        truth = read_labels(labels) if labels else None
        users = classify(ing.jobs, ov, behaviour)
        bar.update(task, advance=1, description="building the report")
        report = build(ing, users, truth, behaviour, capacity_cores)
        bar.update(task, advance=1)
    if html_out:
        try:
            html_out.write_text(html_page(report))
        except OSError as e:
            raise InvalidRequest(f"cannot write {html_out}: {e.strerror}") from e
    if csv_dir:
        from corral.analytics.tables import write_csv

        written = write_csv(report["tables"], csv_dir)
        if not as_json:
            click.echo(f"CSV tables: {len(written)} files in {csv_dir}")
    if as_json:
        click.echo(json.dumps(report, default=str))
    else:
        terminal(report)
        if html_out:
            click.echo(f"HTML report: {html_out}")


def _synth_options(f: Any) -> Any:
    for fld in reversed(fields(synth_mod.Params)):
        default = fld.default
        f = click.option(f"--{fld.name.replace('_', '-')}", fld.name, type=type(default), default=default,
                         show_default=True, help=PARAM_HELP.get(fld.name, ""))(f)
    return f


@click.command()
@click.option("--out", "-o", type=click.Path(path_type=Path), required=True,
              help="Where to write the sacct-style export; labels go to OUT.labels.")
@_synth_options
def synth(out: Path, **params: Any) -> None:
    """Write a synthetic facility: a sacct export of human and agent users, with labels.

    \b
    Calibrated by default to the figures published for one production facility:
    agents are 19.5% of users, 55.8% of submissions, 29.1% of CPU core-hours and
    42.7% of GPU-hours; they submit 20.8x as fast while active; 32.7% of their jobs
    end within a minute and 10.3% are cancelled. Every figure is an option.

    \b
    Example:
      corral synth --out facility.txt --jobs 1000000
      corral analyze facility.txt --labels facility.txt.labels
    """
    from rich.console import Console
    from rich.progress import Progress

    p = synth_mod.Params(**params)
    p.check()
    with Progress(transient=True, disable=not _stderr_is_tty(), console=Console(stderr=True)) as bar:
        task = bar.add_task("generating jobs", total=p.jobs)
        try:
            path, labels = synth_mod.write(p, out, progress=lambda n: bar.advance(task, n))
        except OSError as e:
            raise InvalidRequest(f"cannot write {out}: {e.strerror}") from e
    click.echo(f"wrote {p.jobs:,} jobs of {p.users:,} users to {path}; labels in {labels}")
