"""The dashboard's plots over time, drawn as inline SVG on the server (as the analytics
report draws its own, corral/analytics/plots.py): a time axis in the viewer's clock, a
value axis with its unit, a legend naming each line. No script draws them: the page's
poll swaps in new ones, so a plot is as live as the numbers beside it.

Each line carries its figures (``data-values``) and each plot its unit (``data-unit``)
and its points' times (``data-times``), so a test or a script reads what a person sees."""

from __future__ import annotations

import html
import math
import time
from typing import Mapping, Sequence

W, H, LEFT, RIGHT, TOP, BOTTOM = 300, 120, 44, 8, 26, 34
# Okabe and Ito's colour-blind-safe palette (and its grey): one colour per state and per
# kind, so PENDING and CANCELLED never share one; other series take the rest in turn.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999")
FIXED = {"human": "#0072B2", "agent": "#D55E00", "service": "#009E73",
         "PENDING": "#E69F00", "RUNNING": "#0072B2", "COMPLETED": "#009E73", "FAILED": "#D55E00",
         "CANCELLED": "#999999", "TIMEOUT": "#CC79A7", "OUT_OF_MEMORY": "#56B4E9", "UNKNOWN": "#000000"}
DASHES = ("", "6 3", "2 2", "8 3 2 3", "1 3", "10 4")
"""Each line of a plot its own dash too: lines that lie on each other still both show."""


def axis(top: float, whole: bool = False) -> tuple[float, float]:
    """A value axis up to at least ``top``: (its step, its end), the step 1, 2 or 5 times
    a power of ten, so every tick is a round number (0, 2, 4, 6, 8; never 1.25); of
    ``whole`` things (jobs, calls) the step is at least 1: no tick says 1.5 jobs."""
    if top <= 0:
        return 1.0, 1.0
    raw = top / 4
    step = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * step >= raw * (1 - 1e-9):
            step *= m
            break
    if whole:
        step = max(step, 1.0)
    return step, step * math.ceil(top / step - 1e-9)


def _num(v: float) -> str:
    return f"{v / 1e6:.1f}M" if v >= 1e6 else f"{v / 1e3:.0f}k" if v >= 1e4 else f"{v:g}"


def clock(t: float, seconds: bool = False) -> str:
    return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.localtime(t))


def color_of(name: str, i: int, colors: Mapping[str, str] | None = None) -> str:
    return (colors or {}).get(name) or FIXED.get(name) or PALETTE[i % len(PALETTE)]


def time_ticks(t0: float, t1: float) -> list[float]:
    """Round clock times within [t0, t1]: every 5, 10 or 15 minutes (or seconds, for a
    short span), about four of them."""
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if (t1 - t0) / step <= 6:
            break
    offset = time.localtime(t0).tm_gmtoff  # round in the viewer's clock, not UTC's
    first = math.ceil((t0 + offset) / step) * step - offset
    return [first + k * step for k in range(int((t1 - first) // step) + 1)]


def timeseries(plot_id: str, title: str, unit: str, times: Sequence[float],
               series: Mapping[str, Sequence[float]], colors: dict[str, str] | None = None,
               span: tuple[float, float] | None = None, note: str = "") -> str:
    """One line per series over ``times`` (epoch seconds, ascending), values in ``unit``,
    on a time axis over ``span`` (default: the times'), so plots side by side can share one;
    ``note``: a word inside the plot (why its lines begin late)."""
    esc = html.escape
    if len(times) < 2:
        return (f'<p class="muted nodata" data-plot="{esc(plot_id)}"><b>{esc(title)}</b>: not enough history yet '
                f'(a point every few seconds once the page is open)</p>')
    t0, t1 = span or (times[0], times[-1])
    whole = all(float(v).is_integer() for values in series.values() for v in values)
    step, top = axis(max((max(v, default=0.0) for v in series.values()), default=0.0), whole)
    cols = 3 if max(map(len, series), default=0) <= 14 else 1
    legend_h = 14 * -(-len(series) // cols) + 6
    width, height = LEFT + W + RIGHT, TOP + H + BOTTOM + legend_h

    def px(t: float) -> float:
        return LEFT + (t - t0) / max(1e-9, t1 - t0) * W

    def py(v: float) -> float:
        return TOP + H - v / top * H

    out = [f'<svg role="img" aria-label="{esc(title)} ({esc(unit)})" data-plot="{esc(plot_id)}" '
           f'data-unit="{esc(unit)}" data-span="{t0:.0f},{t1:.0f}" data-times="{",".join(f"{t:.3f}" for t in times)}" '
           f'viewBox="0 0 {width} {height}" class="plot">',
           f'<title>{esc(title)} ({esc(unit)})</title>'
           f'<text x="{LEFT - 34}" y="12" class="title">{esc(title)}</text><g class="axis y" data-label="{esc(unit)}">']
    for k in range(round(top / step) + 1):
        v = k * step
        out.append(f'<line x1="{LEFT}" x2="{LEFT + W}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 4}" y="{py(v) + 3:.1f}" class="tick" text-anchor="end">{_num(v)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="#888"/>'
               f'<text x="10" y="{TOP + H / 2:.0f}" class="tick" text-anchor="middle" '
               f'transform="rotate(-90 10 {TOP + H / 2:.0f})">{esc(unit)}</text></g>'
               f'<g class="axis x" data-label="time">')
    for t in time_ticks(t0, t1):
        out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{TOP + H}" y2="{TOP + H + 3}" stroke="#888"/>'
                   f'<text x="{px(t):.1f}" y="{TOP + H + 12}" class="tick" text-anchor="middle">'
                   f'{clock(t, t1 - t0 < 300)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + H}" x2="{LEFT + W}" y2="{TOP + H}" stroke="#888"/>'
               f'<text x="{LEFT + W / 2}" y="{TOP + H + 25}" class="tick" text-anchor="middle">'
               f'time (local clock)</text></g>')
    if note:
        out.append(f'<text x="{LEFT + 4}" y="{TOP + 10}" class="tick note">{esc(note)}</text>')
    out.append('<g class="lines">')
    for i, (name, values) in enumerate(series.items()):
        dash = f' stroke-dasharray="{DASHES[i % len(DASHES)]}"' if DASHES[i % len(DASHES)] else ""
        pts = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in zip(times, values))
        out.append(f'<polyline fill="none" stroke="{color_of(name, i, colors)}" stroke-width="1.8"{dash} points="{pts}" '
                   f'data-series="{esc(name)}" data-values="{",".join(f"{v:g}" for v in values)}">'
                   f'<title>{esc(name)}: {_num(values[-1])} {esc(unit)} now</title></polyline>'
                   # the latest point marked: a line of a few seconds (the calls since a restart) still shows
                   f'<circle cx="{px(times[-1]):.1f}" cy="{py(values[-1]):.1f}" r="2.2" fill="{color_of(name, i, colors)}"/>')
    out.append('</g><g class="legend">')
    for i, name in enumerate(series):
        dash = f' stroke-dasharray="{DASHES[i % len(DASHES)]}"' if DASHES[i % len(DASHES)] else ""
        x, y = LEFT + (i % cols) * (W // cols), TOP + H + BOTTOM + 10 + 14 * (i // cols)
        out.append(f'<line x1="{x}" x2="{x + 14}" y1="{y - 3}" y2="{y - 3}" stroke="{color_of(name, i, colors)}" '
                   f'stroke-width="2"{dash}/>'
                   f'<text x="{x + 18}" y="{y}" class="tick" data-series="{esc(name)}">{esc(name)}</text>')
    out.append("</g></svg>")
    return "".join(out)
