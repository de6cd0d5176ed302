"""The report for people: a terminal table (rich) and one self-contained HTML page.

Both are drawn from the JSON report alone. The HTML carries its styles and its
plots (inline SVG) in the one file: it opens from a mail attachment or an air-gapped
share, with no script and nothing fetched.
"""

from __future__ import annotations

import html
import math
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

AGENT, HUMAN = "#D55E00", "#0072B2"  # Okabe-Ito: colour-blind safe
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
ROWS = (  # (label, key in groups, format)
    ("users", "users", "{:,}"),
    ("jobs", "jobs", "{:,}"),
    ("CPU core-hours", "core_hours", "{:,.0f}"),
    ("GPU-hours", "gpu_hours", "{:,.0f}"),
    ("submissions / active hour", "submissions_per_active_hour", "{:.2f}"),
    ("jobs under a minute", "under_minute_share", "{:.1%}"),
    ("cancelled", "cancelled_share", "{:.1%}"),
    ("failed (incl. OOM, timeout)", "failed_share", "{:.1%}"),
    ("submitted off hours", "off_hours_share", "{:.1%}"),
    ("queue wait p50", "wait_p50_s", "{:,.0f} s"),
    ("queue wait p90", "wait_p90_s", "{:,.0f} s"),
    ("users who failed", "users_with_failures", "{:,}"),
    ("… and repeated it in a later session", "users_repeating_failure", "{:,}"),
    ("repeated identical failures (jobs)", "repeated_failure_jobs", "{:,}"),
)
HEADERS = {"core_hours": "CPU core-hours", "gpu_hours": "GPU-hours", "p_agent": "p(agent)",
           "off_hours": "off hours"}
"""A table's column as a person reads it (the CSV export keeps the keys)."""
SHARES = (("users", "user_share"), ("submissions", "submission_share"),
          ("CPU core-hours", "core_hour_share"), ("GPU-hours", "gpu_hour_share"))


def _fmt(fmt: str, v: Any) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.1%}"


def terminal(r: dict[str, Any], console: Console | None = None) -> None:
    """Print the report as tables."""
    console = console or Console()
    a = r["agents"]
    head = Table(title="What agents take of the facility", show_header=True, header_style="bold")
    head.add_column("")
    head.add_column("agents' share", justify="right")
    for label, key in SHARES:
        head.add_row(label, _pct(a[key]))
    head.add_row("submission rate vs humans", "—" if a["rate_vs_humans"] is None else f"{a['rate_vs_humans']:.1f}x")
    groups = Table(title="Agents and humans side by side", header_style="bold")
    groups.add_column("")
    groups.add_column("agents", justify="right", style="dark_orange")
    groups.add_column("humans", justify="right", style="dodger_blue2")
    for label, key, fmt in ROWS:
        groups.add_row(label, _fmt(fmt, r["groups"]["agent"].get(key)), _fmt(fmt, r["groups"]["human"].get(key)))
    s, c = r["source"], r["classification"]
    lines = [f"{s['path']} ({s['format']}): {s['rows_read']:,} rows, {s['jobs']:,} jobs, "
             f"{s['steps_skipped']:,} job steps skipped, {s['malformed']:,} malformed"]
    lines += [f"  malformed: {n:,} {why} (e.g. line {', '.join(map(str, s['malformed_examples'].get(why, [])))})"
              for why, n in s["malformed_by_reason"].items()]
    lines += [f"  note: {n}" for n in s["notes"]]
    lines.append(f"who is an agent: {c['method']}; " + ", ".join(f"{k}: {v}" for k, v in sorted(c["by_basis"].items())))
    lines.append(would_flag(c))
    if "against_labels" in c:
        acc = c["against_labels"]
        lines.append(f"against the labels: {acc['correct']}/{acc['users']} users right ({acc['accuracy']:.1%})")
    if c["low_confidence_users"]:
        lines.append("least certain: " + ", ".join(f"{u['user']} ({u['p_agent']:.2f})" for u in c["low_confidence_users"][:8])
                     + " - settle them in an override file (--overrides)")
    for w in s.get("warnings", []):
        console.print(f"[bold red]warning:[/] {w}")
    console.print(Group(head, groups, Panel("\n".join(lines), title="data and method", expand=False)))


def would_flag(c: dict[str, Any]) -> str:
    """The behaviour score's verdict, said even where it decided nothing (SWF traces,
    where it is off): on people's own traces it is the score's false-positive count."""
    n, users = c["behaviour_would_flag"], c["users"]
    return (f"the behaviour score would flag {n:,} of {users:,} users as agents (p_agent at least 0.5)"
            + ("" if c["method"].startswith("provenance") else "; it decided nothing here (--classify to use it)"))


def _bars(a: dict[str, Any]) -> str:
    """Stacked 100% bars: the agents' share of each resource."""
    w, row = 560, 34
    out = [f'<svg role="img" aria-label="agents share of users, submissions, core-hours, GPU-hours" '
           f'width="{w + 170}" height="{row * len(SHARES) + 10}" class="bars">']
    for i, (label, key) in enumerate(SHARES):
        y = i * row + 4
        out.append(f'<text x="0" y="{y + 18}">{label}</text>')
        if a[key] is None:  # nothing of it in the export: said, as on its card, not drawn as 0%
            out.append(f'<text x="150" y="{y + 17}" class="none">— (no {label} in this export)</text>')
            continue
        v = a[key]
        out.append(f'<rect x="150" y="{y}" width="{w * v:.1f}" height="24" fill="{AGENT}"><title>agents {v:.1%}</title></rect>')
        out.append(f'<rect x="{150 + w * v:.1f}" y="{y}" width="{w * (1 - v):.1f}" height="24" fill="{HUMAN}" '
                   f'opacity="0.35"><title>humans {1 - v:.1%}</title></rect>')
        out.append(f'<text x="{156 + w * v:.1f}" y="{y + 17}" class="val">{v:.1%}</text>')
    out.append("</svg>")
    return "".join(out)


def _heat(grid: list[list[int]], color: str, label: str) -> str:
    """Hour-by-weekday heatmap of one group's submissions."""
    cell, left, top = 18, 36, 16
    peak = max((max(r) for r in grid), default=0) or 1
    out = [f'<svg role="img" aria-label="{label} submissions by hour and weekday" class="heat" '
           f'width="{left + 24 * cell + 4}" height="{top + 7 * cell + 4}">']
    for h in range(0, 24, 3):
        out.append(f'<text x="{left + h * cell}" y="11" class="small">{h:02d}</text>')
    for d, row in enumerate(grid):
        out.append(f'<text x="0" y="{top + d * cell + 13}" class="small">{DAYS[d]}</text>')
        for h, n in enumerate(row):
            op = 0.06 + 0.94 * (n / peak) ** 0.6 if n else 0.03
            out.append(f'<rect x="{left + h * cell}" y="{top + d * cell}" width="{cell - 1}" height="{cell - 1}" '
                       f'fill="{color}" opacity="{op:.2f}"><title>{DAYS[d]} {h:02d}:00 — {n:,} jobs</title></rect>')
    out.append("</svg>")
    return "".join(out) + _heat_scale(peak, color)


def _short_week(period: dict[str, Any]) -> str:
    """Said under the heatmaps of an export shorter than a week: its other weekdays are
    empty because they are not in it, not because nobody submitted."""
    import datetime as dt

    try:
        first, last = (dt.datetime.fromisoformat(str(period[k])) for k in ("first_submit", "last_submit"))
    except (KeyError, TypeError, ValueError):
        return ""
    days = (last.date() - first.date()).days + 1
    if days >= 7:
        return ""
    return (f'<p class="note" id="short-week">The export covers {days} day{"s" if days > 1 else ""} '
            f'({DAYS[first.weekday()]}{" to " + DAYS[last.weekday()] if days > 1 else ""}): the other weekdays are '
            "empty because they are not in it, not because nobody submitted. Export at least a week to compare "
            "weekdays.</p>")


def _heat_scale(peak: int, color: str) -> str:
    """The heatmap's colour scale: what a shade means, in jobs submitted in that hour of
    that weekday over the whole period (the same opacity curve as the cells)."""
    stops = sorted({0, round(peak / 16), round(peak / 4), round(peak / 2), peak})
    cell = 18
    label = "jobs submitted in that hour"  # sized for its text (it was clipped at 140 px)
    width = 36 + len(stops) * 3 * cell + 8 + 6 * len(label)
    out = [f'<svg role="img" aria-label="colour scale: jobs an hour" class="heat-scale" '
           f'width="{width}" height="30" viewBox="0 0 {width} 30">']
    for i, n in enumerate(stops):
        op = 0.06 + 0.94 * (n / peak) ** 0.6 if n else 0.03
        x = 36 + i * 3 * cell
        out.append(f'<rect x="{x}" y="2" width="{cell - 1}" height="{cell - 1}" fill="{color}" opacity="{op:.2f}"/>'
                   f'<text x="{x + cell + 2}" y="15" class="small">{n:,}</text>')
    out.append(f'<text x="{36 + len(stops) * 3 * cell}" y="15" class="small">{label}</text></svg>')
    return "".join(out)


def _scatter(users: list[dict[str, Any]]) -> str:
    """Each user: submissions per active hour (log) against share of off-hours work."""
    w, h, pad = 560, 300, 40
    lo, hi = math.log10(0.5), math.log10(200)
    head = 24  # the title's band, above the plot
    out = [f'<svg role="img" aria-label="users by submission rate and off-hours share" width="{w + pad + 10}" '
           f'height="{h + pad + 10 + head}" class="scatter">',
           '<text x="2" y="14" class="title">Each user: how fast they submit, and how much of it off hours</text>',
           f'<g transform="translate(0 {head})">',
           f'<line x1="{pad}" y1="{h}" x2="{w + pad}" y2="{h}" stroke="#888"/>',
           f'<line x1="{pad}" y1="0" x2="{pad}" y2="{h}" stroke="#888"/>']
    for share in (0, 0.5, 1):  # the same mapping as the dots': 100% at 10 px from the top
        y = h - share * (h - 10)
        out.append(f'<line x1="{pad}" x2="{w + pad}" y1="{y:.0f}" y2="{y:.0f}" stroke="#eee"/>'
                   f'<text x="{pad - 4}" y="{y + 4:.0f}" class="small" text-anchor="end">{share:.0%}</text>')
    for tick in (1, 10, 100):
        x = pad + (math.log10(tick) - lo) / (hi - lo) * w
        out.append(f'<text x="{x:.0f}" y="{h + 16}" class="small">{tick}</text>')
    out.append(f'<text x="{pad + w / 2 - 80}" y="{h + 34}" class="small">submissions per active hour (log)</text>')
    out.append(f'<text x="10" y="{h / 2:.0f}" class="small" text-anchor="middle" transform="rotate(-90 10 {h / 2:.0f})">'
               'submitted off hours</text>')
    for i, (label, color) in enumerate((("agent", AGENT), ("human", HUMAN))):  # the legend
        out.append(f'<circle cx="{w + pad - 60}" cy="{10 + 16 * i}" r="4" fill="{color}"/>'
                   f'<text x="{w + pad - 50}" y="{14 + 16 * i}" class="small">{label}</text>')
    for u in users[:5000]:
        if not u.get("rate"):
            continue
        x = pad + (min(max(math.log10(u["rate"]), lo), hi) - lo) / (hi - lo) * w
        y = h - (u.get("off_hours") or 0) * (h - 10)
        c = AGENT if u["kind"] == "agent" else HUMAN
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{c}" opacity="0.7">'
                   f'<title>{html.escape(str(u["user"]))}: {u["kind"]} ({u["basis"]}), {u["jobs"]:,} jobs</title></circle>')
    out.append("</g></svg>")
    return "".join(out)


CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:980px;color:#222;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:0} svg text{font:12px system-ui,sans-serif;fill:#333} svg text.val{fill:#1d232b;font-weight:600}
svg text.small{font-size:10.5px;fill:#666} table{border-collapse:collapse;margin:.5rem 0}
td,th{padding:.25rem .8rem;border-bottom:1px solid #eee;text-align:right} td:first-child,th:first-child{text-align:left}
.agent{color:#D55E00;font-weight:600} .human{color:#0072B2;font-weight:600}
.cards{display:flex;gap:1rem;flex-wrap:wrap} .card{border:1px solid #e5e5e5;border-radius:8px;padding:.7rem 1rem;min-width:150px}
.card b{display:block;font-size:1.5rem;color:#D55E00} .heats{display:flex;gap:2rem;flex-wrap:wrap}
.note{color:#666;font-size:.9rem} code{background:#f4f4f4;padding:0 .25rem}
svg text.none{fill:#666;font-style:italic} svg text.title{font-size:12.5px;font-weight:600;fill:#222}
.warn{color:#b3261e;font-weight:600;border-left:4px solid #b3261e;padding-left:.6rem}
"""


def _table(rows: list[dict[str, Any]], table_id: str, limit: int = 50) -> str:
    if not rows:
        return '<p class="note">none</p>'
    e = html.escape
    cols = list(rows[0])
    head = "".join(f"<th>{e(HEADERS.get(str(c), str(c).replace('_', ' ')))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{e(_cell(r[c]))}</td>" for c in cols) + "</tr>" for r in rows[:limit])
    more = f'<p class="note">{len(rows) - limit:,} more rows in the CSV export (--csv DIR)</p>' if len(rows) > limit else ""
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>{more}'


def _cell(v: Any) -> str:
    return "—" if v is None else f"{v:,.2f}".rstrip("0").rstrip(".") if isinstance(v, float) else f"{v:,}" \
        if isinstance(v, int) else str(v)


def _seconds(rows: list[dict[str, Any]], bins: list[str]) -> list[dict[str, Any]]:
    """A distribution's quantiles with their unit in the header (p50 (s))."""
    return [{(f"{k} (s)" if k.startswith("p") or k == "max" else k): v for k, v in r.items() if k not in bins}
            for r in rows]


def _tables(t: dict[str, Any]) -> str:
    """Over time, breakdowns, distributions, users and use against capacity."""
    if not t:
        return ""
    from corral.analytics.plots import histogram, timeseries
    from corral.analytics.tables import BINS

    bins = [b for _, _, b in BINS]
    days = sorted({str(r["day"]) for r in t["daily"]})
    over_time = [timeseries(t["daily"], "day", "jobs", "Jobs submitted each day, by group"),
                 timeseries(t["daily"], "day", "core_hours", "CPU core-hours used each day, by group"),
                 timeseries(t["daily"], "day", "gpu_hours", "GPU-hours used each day, by group")
                 if any(r["gpu_hours"] for r in t["daily"]) else
                 '<p class="note" id="no-gpu-hours">No GPU-hours in this export, so no GPU plot is drawn '
                 "(they come from sacct's AllocTRES gres/gpu; an SWF trace has none).</p>"] if len(days) >= 2 else [
        f'<p class="note" id="no-over-time">The export covers {"one day (" + days[0] + ")" if days else "no whole day"}: '
        "a figure over time needs at least two days, so none is drawn. Export a longer period for them.</p>"]
    parts = ["<h2>Over time</h2>", *over_time,
             "<h2>By partition, account and size</h2>",
             _table(t["by_partition"], "by-partition"), _table(t["by_account"], "by-account", 30),
             _table(t["by_size"], "by-size"),
             "<h2>Waits and run times</h2>",
             histogram(t["wait_distribution"], bins, "How long jobs waited in the queue"),
             _table(_seconds(t["wait_distribution"], bins), "wait-quantiles"),
             histogram(t["run_distribution"], bins, "How long jobs ran"),
             _table(_seconds(t["run_distribution"], bins), "run-quantiles"),
             "<h2>Users, least certain first</h2>", _table(t["users"], "users", 40)]
    if t.get("utilisation") and len(days) >= 2:
        parts += ["<h2>Use against capacity</h2>",
                  timeseries(t["utilisation"], "day", "utilisation", "Share of the facility's core-hours used each day",
                             series="", cls="ts use")]
    return "\n".join(parts)


def html_page(r: dict[str, Any]) -> str:
    """One self-contained HTML document."""
    a, g, s, c = r["agents"], r["groups"], r["source"], r["classification"]
    e = html.escape
    cards = "".join(f'<div class="card"><b>{_pct(a[k])}</b>agents\' share of {label}'
                    + (f' <span class="note">(no {label} in this export)</span>' if a[k] is None else "") + "</div>"
                    for label, k in SHARES)
    rate = "—" if a["rate_vs_humans"] is None else f"{a['rate_vs_humans']:.1f}x"
    cards += f'<div class="card"><b>{rate}</b>agents\' submission rate vs humans\'</div>'
    rows = "".join(f"<tr><td>{e(label)}</td><td>{_fmt(fmt, g['agent'].get(k))}</td><td>{_fmt(fmt, g['human'].get(k))}</td></tr>"
                   for label, k, fmt in ROWS)
    bad = "".join(f"<li>{n:,} {e(why)} (e.g. line {', '.join(map(str, s['malformed_examples'].get(why, [])))})</li>"
                  for why, n in s["malformed_by_reason"].items())
    notes = "".join(f"<li>{e(n)}</li>" for n in s["notes"])
    acc = ""
    if "against_labels" in c:
        al = c["against_labels"]
        acc = f"<p>Against the ground-truth labels: <b>{al['correct']}/{al['users']}</b> users right ({al['accuracy']:.1%}).</p>"
    basis = ", ".join(f"{e(k)}: {v}" for k, v in sorted(c["by_basis"].items()))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>corral: what agents do on this facility</title><style>{CSS}</style></head><body>
<h1>What agents do on this facility</h1>
<p class="sub">{e(s['path'])} · {s['jobs']:,} jobs · {e(str(r['period']['first_submit']))} to {e(str(r['period']['last_submit']))}</p>
{"".join(f'<p class="warn">warning: {e(w)}</p>' for w in s.get("warnings", []))}
<div class="cards" id="cards">{cards}</div>
<h2>Agents' share</h2>{_bars(a)}
<h2>Agents and humans side by side</h2>
<table id="groups"><tr><th></th><th class="agent">agents</th><th class="human">humans</th></tr>{rows}</table>
<h2>When they submit</h2>
<div class="heats"><div><p class="agent">agents</p>{_heat(r['heatmap']['agent'], AGENT, 'agents')}</div>
<div><p class="human">humans</p>{_heat(r['heatmap']['human'], HUMAN, 'humans')}</div></div>{_short_week(r['period'])}
<h2>Who is an agent</h2>
<p>Each user's verdict comes from, in turn: {e(c['method'])}. Users: {c['users']:,} ({basis}).</p>
<p id="would-flag">{e(would_flag(c)[0].upper() + would_flag(c)[1:])}.</p>{acc}
{_scatter(c['users_detail'])}
<p class="note">Each dot is a user; colour is the verdict. Hover for the user. Settle doubtful users in an override file
(<code>corral analyze FILE --overrides FILE</code>).</p>
{_tables(r.get('tables') or {})}
<h2>The data</h2>
<p>{s['rows_read']:,} rows read ({e(s['format'])}); {s['jobs']:,} jobs; {s['steps_skipped']:,} job steps skipped;
{s['malformed']:,} malformed rows left out.</p><ul>{bad}{notes}</ul>
<p class="note">Made by <code>corral analyze</code>. Definitions: core-hours = elapsed × allocated CPUs; GPU-hours from
AllocTRES gres/gpu; under a minute = elapsed &lt; 60 s; a repeated failure has the same user, job name, state and exit
code as a failure in an earlier session (30 min without a submission ends a session).</p>
</body></html>
"""
