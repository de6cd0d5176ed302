"""Inline SVG plots for the HTML report, each with its axes, ticks and a legend: the
daily time series by group, and the distributions' histograms. No script, nothing
fetched: the page stays one file."""

from __future__ import annotations

import html
from typing import Any

COLORS = {"agent": "#D55E00", "human": "#0072B2", "use": "#009E73"}  # Okabe-Ito, as render.py
W, H, LEFT, BOTTOM, TOP = 620, 200, 56, 34, 24


def _nice(top: float) -> float:
    """A round axis maximum at or above ``top``."""
    if top <= 0:
        return 1.0
    step = 10 ** len(str(int(top))) / 10
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= top:
            return m * step
    return 10 * step


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
    top = _nice(max((float(r[y] or 0) for r in rows), default=0))
    def px(i: int) -> float:
        return LEFT + (i / max(1, len(xs) - 1)) * W

    def py(v: float) -> float:
        return TOP + H - v / top * H

    out = [f'<svg role="img" aria-label="{html.escape(label)}" class="{cls}" width="{LEFT + W + 110}" '
           f'height="{TOP + H + BOTTOM + 8}">']
    for k in range(5):  # y ticks and grid
        v = top * k / 4
        out.append(f'<line x1="{LEFT}" x2="{LEFT + W}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{py(v) + 4:.1f}" class="small" text-anchor="end">{_num(v)}</text>')
    step = max(1, len(xs) // 6)
    for i in range(0, len(xs), step):  # x ticks
        out.append(f'<text x="{px(i):.1f}" y="{TOP + H + 16}" class="small" text-anchor="middle">{html.escape(xs[i][5:])}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + H}" x2="{LEFT + W}" y2="{TOP + H}" stroke="#888"/>'
               f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="#888"/>'
               f'<text x="{LEFT + W / 2}" y="{TOP + H + BOTTOM}" class="small" text-anchor="middle">day</text>'
               f'<text x="4" y="8" class="small">{html.escape(label)}</text>')
    index = {d: i for i, d in enumerate(xs)}
    for name in names:
        pts = sorted((index[str(r[x])], float(r[y] or 0)) for r in rows if not series or str(r.get(series)) == name)
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
    top = _nice(max(max(v) for v in shares.values()) * 100) / 100
    slot = W / len(bins)
    bar = slot * 0.8 / len(shares)
    out = [f'<svg role="img" aria-label="{html.escape(label)}" class="hist" width="{LEFT + W + 110}" '
           f'height="{TOP + H + BOTTOM + 8}">']
    for k in range(5):
        v = top * k / 4
        y = TOP + H - v / top * H
        out.append(f'<line x1="{LEFT}" x2="{LEFT + W}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="small" text-anchor="end">{v:.0%}</text>')
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
               f'<text x="4" y="8" class="small">{html.escape(label)} (share of each group\'s jobs)</text>')
    out.append(_legend(sorted(shares), LEFT + W + 14))
    out.append("</svg>")
    return "".join(out)
