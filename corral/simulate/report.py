"""The simulation's report: a terminal table, JSON, and one self-contained HTML page
with inline SVG plots (people's wait distribution, agents' results per hour,
utilisation and the controller's load over the run, the agents' share swept), each
with round ticks, units and a legend, nothing fetched. The axes are in axes.py."""

from __future__ import annotations

import html
import math
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from corral.simulate.axes import Axis, days_axis, duration_axis, log_axis, plot, share_axis

# Okabe and Ito's colour-blind-safe palette, one colour per policy (and a dash each, axes.py).
COLORS = {"plain": "#D55E00", "corral": "#009E73", "corral-new": "#CC79A7", "ban": "#0072B2"}
LIMITS = ("Limits: partitions are pools of cores (no node placement or fragmentation); the controller is a "
          "fluid queue over one-minute buckets calibrated on a test Slurm; agents are a model (closed loops "
          "whose runs within a session are alike: run_jitter), not a trace; preemption requeues the youngest "
          "opportunistic jobs first and their work is lost (counted). See docs/simulation.md.")

NO_DATA = "no data"
"""A figure with nothing under it (no agents, no job of the kind) is said so, never 0."""


def _q(key: str, q: str) -> Any:
    """A percentile of a distribution, None when it holds nothing."""
    return lambda f: f[key][q] if f[key]["n"] else None


def _ctl(q: str) -> Any:
    return lambda f: f["controller"]["people_command_latency_s"][q] if f["controller"]["people_command_latency_s"]["n"] else None


# (label, the figure from a run's, its kind: "dur" rows share one unit across the policies)
ROWS: list[tuple[str, Any, str]] = [
    ("people's wait p50", _q("people_wait_s", "p50"), "dur"),
    ("people's wait p90", _q("people_wait_s", "p90"), "dur"),
    ("people's bounded slowdown p50", lambda f: f"{f['people_bounded_slowdown']['p50']:.2f}", "text"),
    ("agents' loop, short jobs p50", _q("agent_loop_short_s", "p50"), "dur"),
    ("agents' loop, short jobs p90", _q("agent_loop_short_s", "p90"), "dur"),
    ("agents' results/h", lambda f: f"{f['agent_results_per_h']:.1f}" if f["agents"] else NO_DATA, "text"),
    ("utilisation", lambda f: f"{f['utilisation']:.1%}", "text"),
    ("utilisation less work lost", lambda f: f"{f['useful_utilisation']:.1%}", "text"),
    ("work lost to requeues (core-h)", lambda f: f"{f['lost_core_h']:,.0f}", "text"),
    ("preemptions", lambda f: f"{f['preemptions']:,}", "text"),
    ("controller RPCs/s", lambda f: small(f["controller"]["rpc_per_s"]), "text"),
    ("controller busy", lambda f: small(f["controller"]["utilisation"] * 100) + "%", "text"),
    ("people's squeue latency p50", _ctl("p50"), "dur"),
    ("people's squeue latency p90", _ctl("p90"), "dur"),
    ("people's jobs/h", lambda f: f"{f['people_jobs_per_h']:.1f}", "text"),
]


def small(v: float) -> str:
    """A figure that may be well under 1 with its first two digits (0.0093, not 0.00 beside
    a plot that shows it): a banned agent's controller load is small, not nothing."""
    if v == 0 or abs(v) >= 0.1:
        return "0" if v == 0 else f"{v:,.2f}"
    return f"{v:.{1 - math.floor(math.log10(abs(v)))}f}"


UNITS = ((1e-3, "ms"), (1.0, "s"), (60.0, "min"), (3600.0, "h"))


def unit_for(values: list[float | None]) -> tuple[float, str]:
    """One unit for a row of durations, chosen by its largest (5.6 h beside 1.6 h,
    never beside 94.4 min)."""
    top = max((v for v in values if v is not None), default=0.0)
    return (1e-3, "ms") if top < 1 else (1.0, "s") if top < 120 else (60.0, "min") if top < 7200 else (3600.0, "h")


def durations(values: list[float | None]) -> list[str]:
    scale, name = unit_for(values)
    return [NO_DATA if v is None else "0 s" if v == 0 else f"{v / scale:,.1f} {name}" for v in values]


def row_cells(get: Any, kind: str, runs: list[dict[str, Any]]) -> list[str]:
    return durations([get(f) for f in runs]) if kind == "dur" else [get(f) for f in runs]


def _dur(s: float) -> str:
    return durations([s])[0]


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def warnings_text(r: dict[str, Any]) -> list[str]:
    return [f"warning ({w['about']}): {w['says']}" for w in r.get("warnings", [])]


def terminal(r: dict[str, Any], console: Console | None = None) -> None:
    c = console or Console()
    sc = r["scenario"]
    fac = sc["facility"]
    c.print(f"[bold]{fac['name']}[/]: {fac['nodes']:,} nodes, {fac['cores']:,} cores; {sc['days']} days; "
            f"{plural(sc['people'], 'person', 'people')}, agents {sc['agents']['share']:.0%} of users; "
            f"{sc['scheduler']['algorithm']}; seed {sc['seed']}", highlight=False)
    for line in warnings_text(r):
        c.print(line, style="yellow", highlight=False, markup=False)
    t = Table(show_header=True, header_style="bold")
    t.add_column("")
    pols = r["policies"]
    for name, f in pols.items():
        t.add_column(f"{name} ({plural(f['agents'], 'agent')})", justify="right")
    for label, get, kind in ROWS:
        t.add_row(label, *row_cells(get, kind, list(pols.values())))
    c.print(t)
    c.print(LIMITS, style="dim")
    if r.get("sweep"):
        c.print(sweep_table(r["sweep"]))


SWEEP_COLS = ("share", "policy", "agents", "people p50", "people p90", "agent loop p50", "results/h",
              "utilisation", "RPCs/s")


def sweep_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The sweep's rows as shown: each duration column in one unit; agents' figures of a
    row without agents (or without a short job) "no data", as the plots leave them out."""
    def agentless(row: dict[str, Any]) -> bool:
        return not row["agents"] or not row.get("agent_loop_short_n", 1)

    p50 = durations([row["people_wait_p50_s"] if row.get("people_wait_n", 1) else None for row in rows])
    p90 = durations([row["people_wait_p90_s"] if row.get("people_wait_n", 1) else None for row in rows])
    loop = durations([None if agentless(row) else row["agent_loop_short_p50_s"] for row in rows])
    return [[f"{row['share']:.0%}", row["policy"], str(row["agents"]), p50[i], p90[i], loop[i],
             f"{row['agent_results_per_h']:.1f}" if row["agents"] else NO_DATA, f"{row['utilisation']:.1%}",
             f"{row['rpc_per_s']:.2f}"] for i, row in enumerate(rows)]


def sweep_table(rows: list[dict[str, Any]]) -> Table:
    s = Table(title="agents' share of users, swept", header_style="bold")
    for col in SWEEP_COLS:
        s.add_column(col, justify="right")
    for cells in sweep_cells(rows):
        s.add_row(*cells)
    return s


SERIES = ("controller_series", "people_wait_cdf", "results_series", "busy_series")


def to_json(r: dict[str, Any]) -> str:
    """The report without the plots' point series."""
    slim = {**r, "policies": {k: {x: y for x, y in v.items() if x not in SERIES} for k, v in r["policies"].items()},
            "limits": LIMITS}
    return json.dumps(slim, indent=2)


def _days(series: list[tuple[float, ...]], col: int) -> list[tuple[float, float]]:
    return [(row[0] / 86400, row[col]) for row in series]


def _nonzero(series: dict[str, list[tuple[float, float]]]) -> dict[str, list[tuple[float, float]]]:
    return {k: v for k, v in series.items() if any(y > 0 for _, y in v)}


def _log_plot(series: dict[str, list[tuple[float, float]]], title: str, t_axis: Axis, label: str, floor: float,
              percent: bool = False) -> list[str]:
    """A quantity over the run on a log scale down to its smallest value (an hour at 0 is
    drawn there); a policy at 0 throughout is said, not drawn along the axis' floor as if
    it were that small."""
    floor = min((v for pts in series.values() for _, v in pts if v > 0), default=floor)
    shown = {n: [(d, max(v, floor)) for d, v in pts] for n, pts in _nonzero(series).items()}
    zero = [n for n in series if n not in shown]
    out = [plot(shown, f"{title} (hourly mean, log scale)", t_axis, log_axis(shown, label, percent=percent), COLORS)
           ] if shown else []
    if zero:
        out.append(f'<p class="note zero" data-about="{html.escape(title)}">{html.escape(title)}: '
                   f'{html.escape(", ".join(zero))} at 0 throughout, which a log scale cannot place: not drawn.</p>')
    return out


def _plots(r: dict[str, Any]) -> list[str]:
    pols = r["policies"]
    days = r["scenario"]["days"]
    t_axis = days_axis(days)
    cdf = {n: f["people_wait_cdf"] for n, f in pols.items()}
    waits = [x for s in cdf.values() for x, _ in s if x > 0]
    at_once = {n: f["people_wait_at_once"] for n, f in pols.items() if f.get("people_wait_at_once")}
    out = [plot(cdf, "People's wait: share of their jobs that waited at most this long",
                duration_axis(min(waits, default=1.0), max(waits, default=3600.0), "wait (log scale)"),
                share_axis("share of people's jobs"), COLORS)]
    if at_once:
        out.append('<p class="note">People\'s jobs that started at once (a wait of 0, which a log scale cannot '
                   "place; the line starts above 0 at the axis' left end): " + ", ".join(f"{html.escape(n)} {v:.0%}" for n, v in at_once.items())
                   + ".</p>")
    out += [
           plot(_nonzero({n: f["results_series"] for n, f in pols.items()}),
                "Agents' results per hour over the run (hourly)", t_axis,
                Axis.linear(0, max((y for f in pols.values() for _, y in f["results_series"]), default=1.0),
                            "results per hour"), COLORS),
           plot({n: f["busy_series"] for n, f in pols.items()}, "Utilisation over the run (hourly mean)", t_axis,
                share_axis("share of the machine's cores busy"), COLORS)]
    for col, title, label, floor in ((1, "Controller load: RPCs per second", "RPCs per second (log scale)", 1e-3),
                                     (2, "Controller busy: share of its time serving RPCs",
                                      "share of time busy (log scale)", 1e-5)):
        out += _log_plot({n: [(d, v) for d, v in _days(f["controller_series"], col) if d < days]
                          for n, f in pols.items()}, title, t_axis, label, floor, percent=col == 2)
    if r.get("sweep"):
        out += _sweep_plots(r["sweep"])
    return out


def _sweep_plots(rows: list[dict[str, Any]]) -> list[str]:
    """The sweep's figures against the share; none when the shares give one and the same
    agents (the rows repeat one run: flat lines would read as a trend), said instead."""
    shares = sorted({row["share"] for row in rows})
    agents = {row["agents"] for row in rows if row["policy"] != "ban"}
    if len(shares) < 2 or len(agents) < 2:
        return ['<p class="note" id="no-sweep-plots">No plot against the share is drawn: '
                + (f"every share swept gives {plural(agents.pop(), 'agent')}, so its rows repeat one run, not a "
                   "trend (see the warning above)." if len(agents) == 1 else "it needs two shares or more.")
                + "</p>"]
    out: list[str] = []
    x = Axis.ticked(shares[0] * 100, shares[-1] * 100, [v * 100 for v in shares],
                    lambda v: f"{v:.0f}%", "agents' share of users")
    for key, label, kind in (("people_wait_p50_s", "People's median wait", "dur"),
                             ("people_wait_p90_s", "People's 90th-percentile wait", "dur"),
                             ("agent_results_per_h", "Agents' results per hour", "lin"),
                             ("agent_loop_short_p50_s", "Agents' loop on a sub-minute job, median", "dur"),
                             ("utilisation", "Utilisation", "share"),
                             ("rpc_per_s", "Controller RPCs per second (log scale)", "log")):
        by: dict[str, list[tuple[float, float]]] = {}
        for row in rows:
            if key.startswith("agent") and (row["agents"] == 0 or (
                    key == "agent_loop_short_p50_s" and not row.get("agent_loop_short_n", 1))):
                continue
            by.setdefault(row["policy"], []).append((row["share"] * 100, max(row[key], 1e-3)))
        ys = [y for s in by.values() for _, y in s]
        if kind == "dur":
            y = duration_axis(min(ys, default=1.0), max(ys, default=60.0), "time (log scale)")
        elif kind == "share":
            y = share_axis("share of cores busy")
        elif kind == "log":
            y = log_axis(by, "RPCs per second (log scale)")
        else:
            y = Axis.linear(0, max(ys, default=1.0), "results per hour")
        out.append(plot(by, f"{label} against agents' share of users", x, y, COLORS))
    return out


def _scenario(sc: dict[str, Any]) -> str:
    fac = sc["facility"]
    rows = "".join(f"<tr><td>{html.escape(p['name'])}</td><td>{p['nodes']:,}</td><td>{p['cores_per_node']}</td>"
                   f"<td>{p['memory_gb_per_node']} GB</td><td>{p['gpus_per_node']}</td><td>{p['max_walltime_h']:g} h</td></tr>"
                   for p in fac["partitions"])
    a, s, c, lv = sc["agents"], sc["scheduler"], sc["controller"], sc.get("levers", {})
    items = [
        ("Simulated time", f"{sc['days']:g} days, seed {sc['seed']}"),
        ("People", f"{sc['people']:,}, each submitting {sc['person_jobs_per_day']:g} jobs and "
                   f"{sc['person_core_hours_per_day']:,.0f} core-hours a day; one squeue -u every {sc['people_poll_s']:g} s"),
        ("Agents", f"{a['share']:.0%} of users; sessions of {a['loops']:g} jobs on average, {a['think_s']:g} s to think "
                   f"(median); {a['short']:.0%} of jobs under a minute; outside corral, squeue -j every {a['poll_s']:g} s"),
        ("Scheduler", f"{s['algorithm']}, backfill every {s['backfill_interval_s']:g} s, {s['backfill_depth']} jobs deep"),
        ("Controller", f"sbatch {c['submit_s'] * 1000:.2f} ms, squeue {c['query_base_s'] * 1000:.2f} ms + "
                       f"{c['query_per_job_s'] * 1e6:.1f} µs per job held, squeue -j {c['query_one_s'] * 1000:.2f} ms "
                       f"({html.escape(str(c.get('source', '')))})"),
        ("corral-new's levers", f"guaranteed share {lv.get('guarantee', 0):.0%} of cores, {lv.get('reserve', 0):.0%} left idle "
                                f"by preemptible jobs; walltime = largest of the last "
                                f"{lv.get('history', 3)} runs x {lv.get('margin', 2):g}; opportunistic jobs "
                                f"queue smallest (cores x walltime) first"),
    ]
    if sc.get("corral_without"):
        items.append(("corral without", ", ".join(sc["corral_without"])))
    dl = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items)
    return (f"<h2>Scenario</h2><table><tr><th>partition</th><th>nodes</th><th>cores per node</th><th>memory per node</th>"
            f"<th>GPUs per node</th><th>walltime limit</th></tr>{rows}</table><dl>{dl}</dl>")


def html_page(r: dict[str, Any]) -> str:
    pols = r["policies"]
    head = "".join(f"<th>{html.escape(n)} ({plural(f['agents'], 'agent')})</th>" for n, f in pols.items())
    body = "".join(f'<tr data-row="{html.escape(label)}"><td>{html.escape(label)}</td>'
                   + "".join(f"<td>{html.escape(c)}</td>" for c in row_cells(get, kind, list(pols.values())))
                   + "</tr>" for label, get, kind in ROWS)
    warns = "".join(f'<p class="warn" data-about="{html.escape(w["about"])}"><b>Warning ({html.escape(w["about"])}):</b> '
                    f'{html.escape(w["says"])}</p>' for w in r.get("warnings", []))
    sweep = ""
    if r.get("sweep"):
        sweep = ('<h2>Agents\' share of users, swept</h2><table id="sweep"><tr>'
                 + "".join(f"<th>{html.escape(c)}</th>" for c in SWEEP_COLS) + "</tr>"
                 + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
                           for cells in sweep_cells(r["sweep"])) + "</table>")
    sc = r["scenario"]
    name = html.escape(sc["facility"]["name"])
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>corral simulate: the {name} facility</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ddd;padding:4px 10px;text-align:right}}td:first-child{{text-align:left}}
.warn{{background:#fff4d6;border-left:4px solid #E69F00;padding:.5em .8em}}
.small{{font-size:11px;fill:#444}}.title{{font-size:13px;font-weight:600}}.limits{{color:#555}}dt{{font-weight:600;margin-top:.4em}}dd{{margin-left:1.5em}}
svg{{display:block;margin:1.5em 0}}</style></head>
<body><h1>What agents, and corral, would do to the {name} facility</h1>
<p>{sc['facility']['nodes']:,} nodes, {sc['facility']['cores']:,} cores, {sc['days']:g} days, {plural(sc['people'], 'person', 'people')},
agents {sc['agents']['share']:.0%} of users, scheduler {html.escape(sc['scheduler']['algorithm'])}, seed {sc['seed']}.
The same people's jobs run under every policy; docs/simulation.md describes the model.</p>
{warns}
<p class="limits">{html.escape(LIMITS)}</p>
<table id="figures"><tr><th></th>{head}</tr>{body}</table>
{sweep}
{''.join(_plots(r))}
{_scenario(sc)}</body></html>"""
