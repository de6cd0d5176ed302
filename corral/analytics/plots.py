"""Inline SVG plots for the HTML report, each with its axes, ticks and a legend: the
daily time series by group, and the distributions' histograms. No script, nothing
fetched: the page stays one file."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

from corral.simulate.axes import Axis

COLORS = {"agent": "#D55E00", "human": "#0072B2", "use": "#009E73"}  # Okabe-Ito, as render.py
W, H, LEFT, BOTTOM, TOP = 620, 200, 56, 34, 24


def _axis(top: float) -> Axis:
    """A value axis from 0 to at least ``top`` with round ticks (a 1-2-5 step, as the
    simulator's: 0, 10, 20 ... never 12.5 or 37.5)."""
    return Axis.linear(0.0, top if top > 0 else 1.0, "")


def date_ticks(first: dt.date, last: dt.date) -> list[tuple[dt.date, str]]:
    """Round dates between ``first`` and ``last`` with their labels: the first of each
    month (every 2nd, 3rd or 6th over a long span; the year named on the first and each
    January), Mondays over a few weeks, each day over a week or so."""
    span = (last - first).days
    if span > 60:
        months = [dt.date(y, m, 1) for y in range(first.year, last.year + 1) for m in range(1, 13)
                  if first <= dt.date(y, m, 1) <= last]
        every = next((k for k in (1, 2, 3, 6, 12) if len(months) / k <= 8), 12)
        months = [d for d in months if (d.month - 1) % every == 0]
        return [(d, f"{d:%b}" + (f" {d.year}" if i == 0 or d.month == 1 else "")) for i, d in enumerate(months)]
    step = 7 if span > 10 else 1
    start = first + dt.timedelta(days=(-first.weekday()) % 7) if step == 7 else first
    return [(start + dt.timedelta(days=k), f"{start + dt.timedelta(days=k):%b %d}")
            for k in range(0, (last - start).days + 1, step)]


def _num(v: float) -> str:
    return f"{v / 1e6:.1f}M" if v >= 1e6 else f"{v / 1e3:.0f}k" if v >= 1e4 else f"{v:g}"


def _legend(series: list[str], x: float) -> str:
    return "".join(f'<rect x="{x}" y="{TOP + 16 * i}" width="10" height="10" fill="{COLORS.get(s, "#555")}"/>'
                   f'<text x="{x + 14}" y="{TOP + 9 + 16 * i}" class="small">{html.escape(s)}</text>'
                   for i, s in enumerate(series))


def timeseries(rows: list[dict[str, Any]], x: str, y: str, label: str, series: str = "group",
               cls: str = "ts") -> str:
    """One line per ``series`` value over the ``x`` values (dates), ``y`` against them."""
    xs = sorted({str(r[x]) for r in rows})
    names = sorted({str(r.get(series, "use")) for r in rows}) if series else ["use"]
    if not xs:
        return '<p class="note">no data</p>'
    ax = _axis(max((float(r[y] or 0) for r in rows), default=0))
    top = ax.hi

    dates = {d: dt.date.fromisoformat(d[:10]) for d in xs}
    first, last = dates[xs[0]], dates[xs[-1]]

    def px(d: dt.date) -> float:  # by the calendar: a day without jobs keeps its place
        return LEFT + ((d - first).days / max(1, (last - first).days)) * W

    def py(v: float) -> float:
        return TOP + H - v / top * H

    out = [f'<svg role="img" aria-label="{html.escape(label)}" class="{cls}" width="{LEFT + W + 110}" '
           f'height="{TOP + H + BOTTOM + 8}">']
    for v in ax.ticks:  # y ticks and grid
        out.append(f'<line x1="{LEFT}" x2="{LEFT + W}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{py(v) + 4:.1f}" class="small" text-anchor="end">{_num(v)}</text>')
    for d, text in date_ticks(first, last):  # x ticks at round dates
        out.append(f'<line x1="{px(d):.1f}" x2="{px(d):.1f}" y1="{TOP + H}" y2="{TOP + H + 3}" stroke="#888"/>'
                   f'<text x="{px(d):.1f}" y="{TOP + H + 16}" class="small" text-anchor="middle">{text}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + H}" x2="{LEFT + W}" y2="{TOP + H}" stroke="#888"/>'
               f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="#888"/>'
               f'<text x="{LEFT + W / 2}" y="{TOP + H + BOTTOM}" class="small" text-anchor="middle">date</text>'
               f'<text x="4" y="12" class="title">{html.escape(label)}</text>')
    for name in names:
        pts = sorted((dates[str(r[x])], float(r[y] or 0)) for r in rows if not series or str(r.get(series)) == name)
        path = " ".join(f"{px(i):.1f},{py(v):.1f}" for i, v in pts)
        out.append(f'<polyline fill="none" stroke="{COLORS.get(name, "#555")}" stroke-width="2" points="{path}">'
                   f'<title>{html.escape(name)}</title></polyline>')
    out.append(_legend(names, LEFT + W + 14))
    out.append("</svg>")
    return "".join(out)


def histogram(rows: list[dict[str, Any]], bins: list[str], label: str) -> str:
    """Grouped bars: each group's share of its jobs in each bin."""
    groups = [r for r in rows if r.get("jobs")]
    if not groups:
        return '<p class="note">no data</p>'
    shares = {r["group"]: [r[b] / r["jobs"] for b in bins] for r in groups}
    ax = _axis(max(max(v) for v in shares.values()) * 100)  # in percent, so the ticks are round percents
    top = ax.hi / 100
    slot = W / len(bins)
    bar = slot * 0.8 / len(shares)
    out = [f'<svg role="img" aria-label="{html.escape(label)}" class="hist" width="{LEFT + W + 110}" '
           f'height="{TOP + H + BOTTOM + 8}">']
    for pct in ax.ticks:
        y = TOP + H - pct / 100 / top * H
        out.append(f'<line x1="{LEFT}" x2="{LEFT + W}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="small" text-anchor="end">{pct:g}%</text>')
    for i, b in enumerate(bins):
        out.append(f'<text x="{LEFT + slot * (i + 0.5):.1f}" y="{TOP + H + 16}" class="small" '
                   f'text-anchor="middle">{html.escape(b)}</text>')
        for g, (name, vals) in enumerate(sorted(shares.items())):
            h = vals[i] / top * H
            out.append(f'<rect x="{LEFT + slot * i + slot * 0.1 + g * bar:.1f}" y="{TOP + H - h:.1f}" width="{bar:.1f}" '
                       f'height="{h:.1f}" fill="{COLORS.get(name, "#555")}"><title>{name}: {vals[i]:.1%} of jobs, '
                       f'{html.escape(b)}</title></rect>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + H}" x2="{LEFT + W}" y2="{TOP + H}" stroke="#888"/>'
               f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="#888"/>'
               f'<text x="4" y="12" class="title">{html.escape(label)} (share of each group\'s jobs)</text>')
    out.append(_legend(sorted(shares), LEFT + W + 14))
    out.append("</svg>")
    return "".join(out)
