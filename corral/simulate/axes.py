"""Axes and line plots for the simulation's HTML report, in inline SVG.

Every axis has round ticks (1-2-5 steps, whole days, decades, round durations: 1 s,
10 s, 1 min, 10 min, 1 h), a unit in its label, and a range that ends where the data
does (a plot over the run stops at the run's end). Log scales are for quantities
that span decades (waits, the controller's load), so that an arm near zero is not
flattened onto the axis.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Callable

W, H, LEFT, BOTTOM, TOP, RIGHT = 560, 200, 78, 42, 30, 150
DASHES = ("", "7 4", "2 3", "10 3 2 3")
"""Each series its own dash and marker as well as its colour: a line that lies on
another (corral-new on the ban) still shows, and colour is not the only cue."""
MARKERS = ("circle", "square", "triangle", "diamond")

ROUND_DURATIONS = ((0.001, "1 ms"), (0.01, "10 ms"), (0.1, "0.1 s"), (1, "1 s"), (10, "10 s"), (60, "1 min"),
                   (600, "10 min"), (3600, "1 h"), (36000, "10 h"), (86400, "1 d"), (864000, "10 d"))
DAY_STEPS = (0.25, 0.5, 1, 2, 5, 7, 14, 30, 60, 91, 182, 365)


def _fmt_num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


@dataclass
class Axis:
    lo: float
    hi: float
    label: str
    ticks: list[float] = field(default_factory=list)
    fmt: Callable[[float], str] = _fmt_num
    log: bool = False

    @classmethod
    def linear(cls, lo: float, hi: float, label: str, fmt: Callable[[float], str] = _fmt_num) -> "Axis":
        """Ticks at a 1-2-5 step, the top rounded up to one."""
        span = max(hi - lo, 1e-9)
        raw = span / 5
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
        top = lo + math.ceil(span / step - 1e-9) * step
        n = round((top - lo) / step)
        return cls(lo, top, label, [lo + i * step for i in range(n + 1)], fmt)

    @classmethod
    def ticked(cls, lo: float, hi: float, ticks: list[float], fmt: Callable[[float], str], label: str) -> "Axis":
        return cls(lo, hi if hi > lo else lo + 1, label, ticks, fmt)

    def pos(self, v: float, length: float) -> float:
        """Where ``v`` falls along an axis ``length`` long (clipped to the range)."""
        if self.log:
            lo, hi, x = math.log10(self.lo), math.log10(self.hi), math.log10(max(v, self.lo))
        else:
            lo, hi, x = self.lo, self.hi, v
        frac = (x - lo) / (hi - lo) if hi > lo else 0.0
        return min(max(frac, 0.0), 1.0) * length


def days_axis(days: float) -> Axis:
    """From 0 to the run's end, ticks at whole (or half, quarter) days."""
    step = next((s for s in DAY_STEPS if days / s <= 8), DAY_STEPS[-1])
    n = int(days / step + 1e-9)
    return Axis(0.0, days, "day of the run", [i * step for i in range(n + 1)], lambda v: f"{v:g}")


def share_axis(label: str) -> Axis:
    return Axis(0.0, 1.0, label, [0, 0.25, 0.5, 0.75, 1.0], lambda v: f"{v:.0%}")


def duration_axis(lo: float, hi: float, label: str) -> Axis:
    """Log scale between round durations around [lo, hi]."""
    below = [d for d, _ in ROUND_DURATIONS if d <= max(lo, 0.001)]
    above = [d for d, _ in ROUND_DURATIONS if d >= hi]
    a = below[-1] if below else ROUND_DURATIONS[0][0]
    b = above[0] if above else ROUND_DURATIONS[-1][0]
    if b <= a:
        b = next((d for d, _ in ROUND_DURATIONS if d > a), a * 10)
    names = dict(ROUND_DURATIONS)
    return Axis(a, b, label, [d for d, _ in ROUND_DURATIONS if a <= d <= b], lambda v: names.get(v, f"{v:g} s"), True)


def log_axis(series: dict[str, list[tuple[float, float]]], label: str, percent: bool = False) -> Axis:
    """Decades covering the positive values of every series."""
    ys = [y for s in series.values() for _, y in s if y > 0] or [1.0]
    lo = 10.0 ** math.floor(math.log10(min(ys)))
    hi = 10.0 ** math.ceil(math.log10(max(ys)))
    if hi <= lo:
        hi = lo * 10
    ticks = [10.0 ** k for k in range(round(math.log10(lo)), round(math.log10(hi)) + 1)]
    fmt: Callable[[float], str] = (lambda v: _decade(v * 100) + "%") if percent else _decade
    return Axis(lo, hi, label, ticks, fmt, True)


def _decade(v: float) -> str:
    """A power of ten written out, never as 1e-05: 0.00001, 1, 1,000."""
    return f"{v:,.0f}" if v >= 1 else f"{v:.{max(0, -math.floor(math.log10(v) + 1e-9))}f}"


def _marker(kind: str, x: float, y: float, color: str) -> str:
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>'
    if kind == "square":
        return f'<rect x="{x - 3:.1f}" y="{y - 3:.1f}" width="6" height="6" fill="none" stroke="{color}" stroke-width="1.5"/>'
    pts = ((x, y - 4), (x + 4, y + 3), (x - 4, y + 3)) if kind == "triangle" else ((x, y - 4), (x + 4, y), (x, y + 4), (x - 4, y))
    return (f'<polygon points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}" fill="none" stroke="{color}" '
            f'stroke-width="1.5"/>')


def plot(series: dict[str, list[tuple[float, float]]], title: str, x: Axis, y: Axis,
         colors: dict[str, str]) -> str:
    """One line per series, with a legend; an empty plot says so."""
    if not any(series.values()):
        return f'<p class="note">{html.escape(title)}: no data</p>'

    def px(v: float) -> float:
        return LEFT + x.pos(v, W)

    def py(v: float) -> float:
        return TOP + H - y.pos(v, H)

    out = [f'<svg role="img" aria-label="{html.escape(title)}" width="{LEFT + W + RIGHT}" '
           f'height="{TOP + H + BOTTOM + 8}"><title>{html.escape(title)}</title>',
           f'<text x="4" y="14" class="title">{html.escape(title)}</text>']
    for v in y.ticks:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + W}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{py(v) + 4:.1f}" class="small tick y" text-anchor="end">'
                   f'{html.escape(y.fmt(v))}</text>')
    for v in x.ticks:
        out.append(f'<line x1="{px(v):.1f}" x2="{px(v):.1f}" y1="{TOP + H}" y2="{TOP + H + 4}" stroke="#888"/>'
                   f'<text x="{px(v):.1f}" y="{TOP + H + 16}" class="small tick x" text-anchor="middle">'
                   f'{html.escape(x.fmt(v))}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + H}" x2="{LEFT + W}" y2="{TOP + H}" stroke="#888"/>'
               f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="#888"/>'
               f'<text x="{LEFT + W / 2}" y="{TOP + H + 34}" class="small axis-label" text-anchor="middle">'
               f'{html.escape(x.label)}</text>'
               f'<text transform="translate(14 {TOP + H / 2}) rotate(-90)" class="small axis-label" '
               f'text-anchor="middle">{html.escape(y.label)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = colors.get(name.split()[0], "#555")
        dash = f' stroke-dasharray="{DASHES[i % len(DASHES)]}"' if DASHES[i % len(DASHES)] else ""
        path = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts)
        every = max(1, len(pts) // 12)  # a dozen markers a line at most
        marks = "".join(_marker(MARKERS[i % len(MARKERS)], px(a), py(b), color) for a, b in pts[::every])
        ly = TOP + 18 * i + 5
        out.append(f'<polyline class="series" data-name="{html.escape(name)}" fill="none" stroke="{color}" '
                   f'stroke-width="2"{dash} points="{path}"><title>{html.escape(name)}</title></polyline>'
                   f'<g class="marks">{marks}</g>'
                   f'<g class="legend"><line x1="{LEFT + W + 10}" x2="{LEFT + W + 34}" y1="{ly}" y2="{ly}" stroke="{color}" '
                   f'stroke-width="2"{dash}/>{_marker(MARKERS[i % len(MARKERS)], LEFT + W + 22, ly, color)}'
                   f'<text x="{LEFT + W + 40}" y="{ly + 4}" class="small">{html.escape(name)}</text></g>')
    out.append("</svg>")
    return "".join(out)
