"""The dashboard's plots over time, drawn as inline SVG on the server (as the analytics
report draws its own, corral/analytics/plots.py): a time axis in the viewer's clock, a
value axis with its unit, a legend naming each line. No script draws them: the page's
poll swaps in new ones, so a plot is as live as the numbers beside it.

Each line carries its figures (``data-values``) and each plot its unit (``data-unit``),
so a test or a script reads what a person sees."""

from __future__ import annotations

import html
import math
import time
from typing import Mapping, Sequence

W, H, LEFT, RIGHT, TOP, BOTTOM = 300, 120, 44, 8, 10, 34
PALETTE = ("#1971c2", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#495057")
FIXED = {"agent": "#d9480f", "human": "#1971c2", "service": "#495057", "PENDING": "#e67700",
         "RUNNING": "#2b8a3e", "COMPLETED": "#1971c2", "FAILED": "#b3261e"}


def axis(top: float) -> tuple[float, float]:
    """A value axis up to at least ``top``: (its step, its end), the step 1, 2 or 5 times
    a power of ten, so every tick is a round number (0, 2, 4, 6, 8; never 1.25)."""
    if top <= 0:
        return 1.0, 1.0
    raw = top / 4
    step = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * step >= raw * (1 - 1e-9):
            step *= m
            break
    return step, step * math.ceil(top / step - 1e-9)


def _num(v: float) -> str:
    return f"{v / 1e6:.1f}M" if v >= 1e6 else f"{v / 1e3:.0f}k" if v >= 1e4 else f"{v:g}"


def _clock(t: float, seconds: bool = False) -> str:
    return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.localtime(t))


def timeseries(plot_id: str, title: str, unit: str, times: Sequence[float],
               series: Mapping[str, Sequence[float]], colors: dict[str, str] | None = None) -> str:
    """One line per series over ``times`` (epoch seconds, ascending), values in ``unit``."""
    esc = html.escape
    colors = colors or {}
    if len(times) < 2:
        return f'<p class="muted" data-plot="{esc(plot_id)}">{esc(title)}: not enough history yet</p>'
    t0, t1 = times[0], times[-1]
    step, top = axis(max((max(v, default=0.0) for v in series.values()), default=0.0))
    cols = 3 if max(map(len, series), default=0) <= 14 else 1
    legend_h = 14 * -(-len(series) // cols) + 6
    width, height = LEFT + W + RIGHT, TOP + H + BOTTOM + legend_h

    def px(t: float) -> float:
        return LEFT + (t - t0) / max(1e-9, t1 - t0) * W

    def py(v: float) -> float:
        return TOP + H - v / top * H

    out = [f'<svg role="img" aria-label="{esc(title)} ({esc(unit)})" data-plot="{esc(plot_id)}" '
           f'data-unit="{esc(unit)}" viewBox="0 0 {width} {height}" class="plot">',
           f'<title>{esc(title)} ({esc(unit)})</title><g class="axis y" data-label="{esc(unit)}">']
    for k in range(round(top / step) + 1):
        v = k * step
        out.append(f'<line x1="{LEFT}" x2="{LEFT + W}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 4}" y="{py(v) + 3:.1f}" class="tick" text-anchor="end">{_num(v)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="#888"/>'
               f'<text x="10" y="{TOP + H / 2:.0f}" class="tick" text-anchor="middle" '
               f'transform="rotate(-90 10 {TOP + H / 2:.0f})">{esc(unit)}</text></g>'
               f'<g class="axis x" data-label="time">')
    for k in range(4):
        t = t0 + (t1 - t0) * k / 3
        out.append(f'<text x="{px(t):.1f}" y="{TOP + H + 12}" class="tick" '
                   f'text-anchor="{"start" if k == 0 else "end" if k == 3 else "middle"}">{_clock(t, t1 - t0 < 600)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + H}" x2="{LEFT + W}" y2="{TOP + H}" stroke="#888"/>'
               f'<text x="{LEFT + W / 2}" y="{TOP + H + 25}" class="tick" text-anchor="middle">'
               f'time (local clock)</text></g>')
    out.append('<g class="lines">')
    for i, (name, values) in enumerate(series.items()):
        color = colors.get(name) or FIXED.get(name) or PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in zip(times, values))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{pts}" '
                   f'data-series="{esc(name)}" data-values="{",".join(f"{v:g}" for v in values)}">'
                   f'<title>{esc(name)}: {_num(values[-1])} {esc(unit)} now</title></polyline>')
    out.append('</g><g class="legend">')
    for i, name in enumerate(series):
        color = colors.get(name) or FIXED.get(name) or PALETTE[i % len(PALETTE)]
        x, y = LEFT + (i % cols) * (W // cols), TOP + H + BOTTOM + 10 + 14 * (i // cols)
        out.append(f'<rect x="{x}" y="{y - 8}" width="9" height="9" fill="{color}"/>'
                   f'<text x="{x + 13}" y="{y}" class="tick" data-series="{esc(name)}">{esc(name)}</text>')
    out.append("</g></svg>")
    return "".join(out)
