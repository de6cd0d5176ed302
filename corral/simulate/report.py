"""The simulation's report: a terminal table, JSON, and one self-contained HTML page
with inline SVG plots (people's wait distribution, the controller's load over time,
the agents' share swept), nothing fetched."""

from __future__ import annotations

import html
import json
import math
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

COLORS = {"plain": "#d9480f", "corral": "#2b8a3e", "ban": "#1971c2"}
W, H, LEFT, BOTTOM, TOP = 560, 190, 60, 36, 24

ROWS = [
    ("people's wait p50", lambda f: _dur(f["people_wait_s"]["p50"])),
    ("people's wait p90", lambda f: _dur(f["people_wait_s"]["p90"])),
    ("people's bounded slowdown p50", lambda f: f"{f['people_bounded_slowdown']['p50']:.2f}"),
    ("agents' loop, short jobs p50", lambda f: _dur(f["agent_loop_short_s"]["p50"]) if f["agent_loop_short_s"]["n"] else "-"),
    ("agents' loop, short jobs p90", lambda f: _dur(f["agent_loop_short_s"]["p90"]) if f["agent_loop_short_s"]["n"] else "-"),
    ("utilisation", lambda f: f"{f['utilisation']:.1%}"),
    ("controller RPCs/s", lambda f: f"{f['controller']['rpc_per_s']:.2f}"),
    ("controller busy", lambda f: f"{f['controller']['utilisation']:.1%}"),
    ("people's squeue latency p50", lambda f: _dur(f["controller"]["people_command_latency_s"]["p50"])),
    ("people's squeue latency p90", lambda f: _dur(f["controller"]["people_command_latency_s"]["p90"])),
    ("people's jobs/h", lambda f: f"{f['people_jobs_per_h']:.1f}"),
    ("agents' results/h", lambda f: f"{f['agent_results_per_h']:.1f}"),
]


def _dur(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def terminal(r: dict[str, Any], console: Console | None = None) -> None:
    c = console or Console()
    sc = r["scenario"]
    fac = sc["facility"]
    c.print(f"[bold]{fac['name']}[/]: {fac['nodes']:,} nodes, {fac['cores']:,} cores; {sc['days']} days; "
            f"{sc['people']} people, agents {sc['agents']['share']:.0%} of users; "
            f"{sc['scheduler']['algorithm']}; seed {sc['seed']}")
    t = Table(show_header=True, header_style="bold")
    t.add_column("")
    pols = r["policies"]
    for name, f in pols.items():
        t.add_column(f"{name} ({f['agents']} agents)", justify="right")
    for label, get in ROWS:
        t.add_row(label, *(get(f) for f in pols.values()))
    c.print(t)
    if r.get("sweep"):
        s = Table(title="agents' share of users, swept", header_style="bold")
        for col in ("share", "policy", "agents", "people p50", "people p90", "agent loop p50", "RPCs/s"):
            s.add_column(col, justify="right")
        for row in r["sweep"]:
            s.add_row(f"{row['share']:.0%}", row["policy"], str(row["agents"]), _dur(row["people_wait_p50_s"]),
                      _dur(row["people_wait_p90_s"]), _dur(row["agent_loop_short_p50_s"]), f"{row['rpc_per_s']:.1f}")
        c.print(s)


def to_json(r: dict[str, Any]) -> str:
    """The report without the plots' point series."""
    slim = {**r, "policies": {k: {x: y for x, y in v.items() if x not in ("controller_series", "people_wait_cdf")}
                              for k, v in r["policies"].items()}}
    return json.dumps(slim, indent=2)


def _lines(series: dict[str, list[tuple[float, float]]], label: str, xlabel: str, logx: bool = False,
           yfmt: Callable[[float], str] = lambda v: f"{v:.3g}") -> str:
    pts = [p for s in series.values() for p in s]
    if not pts:
        return '<p class="note">no data</p>'
    fx = (lambda v: math.log10(max(v, 1e-3))) if logx else (lambda v: v)
    x0, x1 = min(fx(p[0]) for p in pts), max(fx(p[0]) for p in pts)
    top = max(p[1] for p in pts) or 1.0
    x1 = x1 if x1 > x0 else x0 + 1

    def px(v: float) -> float:
        return LEFT + (fx(v) - x0) / (x1 - x0) * W

    def py(v: float) -> float:
        return TOP + H - v / top * H

    out = [f'<svg role="img" aria-label="{html.escape(label)}" width="{LEFT + W + 110}" height="{TOP + H + BOTTOM + 8}">',
           f'<text x="4" y="12" class="small">{html.escape(label)}</text>']
    for k in range(5):
        v = top * k / 4
        out.append(f'<line x1="{LEFT}" x2="{LEFT + W}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{py(v) + 4:.1f}" class="small" text-anchor="end">{yfmt(v)}</text>')
    for k in range(6):
        xv = x0 + (x1 - x0) * k / 5
        shown = 10 ** xv if logx else xv
        out.append(f'<text x="{LEFT + W * k / 5:.1f}" y="{TOP + H + 16}" class="small" text-anchor="middle">'
                   f'{_dur(shown) if logx else f"{shown:.3g}"}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + H}" x2="{LEFT + W}" y2="{TOP + H}" stroke="#888"/>'
               f'<text x="{LEFT + W / 2}" y="{TOP + H + BOTTOM}" class="small" text-anchor="middle">{html.escape(xlabel)}</text>')
    for i, (name, s) in enumerate(series.items()):
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
        color = COLORS.get(name.split()[0], "#555")
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"><title>{html.escape(name)}</title></polyline>'
                   f'<rect x="{LEFT + W + 14}" y="{TOP + 16 * i}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{LEFT + W + 28}" y="{TOP + 9 + 16 * i}" class="small">{html.escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def _days(series: list[tuple[float, float, float, float]], col: int) -> list[tuple[float, float]]:
    return [(row[0] / 86400, row[col]) for row in series]


def html_page(r: dict[str, Any]) -> str:
    pols = r["policies"]
    head = "".join(f"<th>{html.escape(n)} ({f['agents']} agents)</th>" for n, f in pols.items())
    body = "".join(f"<tr><td>{html.escape(label)}</td>" + "".join(f"<td>{html.escape(get(f))}</td>" for f in pols.values())
                   + "</tr>" for label, get in ROWS)
    plots = [
        _lines({n: f["people_wait_cdf"] for n, f in pols.items()}, "people's wait: share of jobs waiting at most",
               "wait (log scale)", logx=True, yfmt=lambda v: f"{v:.0%}"),
        _lines({n: _days(f["controller_series"], 1) for n, f in pols.items()}, "controller RPCs per second (hourly mean)",
               "day"),
        _lines({n: _days(f["controller_series"], 3) for n, f in pols.items()}, "command latency (hourly mean)",
               "day", yfmt=_dur),
    ]
    if r.get("sweep"):
        for key, label, fmt in (("people_wait_p50_s", "people's wait p50", _dur),
                                ("rpc_per_s", "controller RPCs per second", lambda v: f"{v:.3g}"),
                                ("agent_loop_short_p50_s", "agents' loop on short jobs p50", _dur)):
            by: dict[str, list[tuple[float, float]]] = {}
            for row in r["sweep"]:
                by.setdefault(row["policy"], []).append((row["share"] * 100, row[key]))
            plots.append(_lines(by, f"{label} against agents' share of users", "agents' share of users (%)", yfmt=fmt))
    sc = r["scenario"]
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>corral simulate: {html.escape(sc['facility']['name'])}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ddd;padding:4px 10px;text-align:right}}td:first-child{{text-align:left}}
.small{{font-size:11px;fill:#444}}pre{{background:#f6f6f6;padding:1em;overflow:auto}}svg{{display:block;margin:1em 0}}</style></head>
<body><h1>What agents, and corral, do to {html.escape(sc['facility']['name'])}</h1>
<p>{sc['facility']['nodes']:,} nodes, {sc['facility']['cores']:,} cores, {sc['days']} days, {sc['people']} people,
agents {sc['agents']['share']:.0%} of users, scheduler {html.escape(sc['scheduler']['algorithm'])}, seed {sc['seed']}.
Same people's jobs in every column; see docs/simulation.md for the model.</p>
<table><tr><th></th>{head}</tr>{body}</table>
{''.join(plots)}
<h2>Scenario</h2><pre>{html.escape(json.dumps(sc, indent=2))}</pre></body></html>"""
