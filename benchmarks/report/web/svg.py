"""Charts as SVG that keep their data: each point or bar carries its numbers as a hover title and links to the
run behind it. Drawn by hand (no plotting library): a series over runs, and bars with a predicted mark."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
WIDTH, PLOT_HEIGHT, LEFT, TOP = 720, 220, 64, 28


@dataclass(frozen=True)
class Point:
    """One measured value of a series: its run (``x``, sortable), the value and its noise (low..high, None
    where the file recorded none), the page it links to and what its title adds."""

    series: str
    x: str
    value: float
    low: float | None = None
    high: float | None = None
    href: str = ""
    note: str = ""


def series_chart(title: str, unit: str, points: list[Point]) -> str:
    """Each series' values over runs in the order they ran, joined by a line; a bar from low to high where the
    noise is known. Hover a point for its numbers; click it for its run."""
    xs = sorted({p.x for p in points})
    top = _nice_top(max(max(p.value, p.high or 0.0) for p in points))
    step = (WIDTH - LEFT - 48) / max(1, len(xs) - 1) if len(xs) > 1 else 0.0
    column = {x: LEFT + (step * i if len(xs) > 1 else (WIDTH - LEFT) / 2) for i, x in enumerate(xs)}
    names = list(dict.fromkeys(p.series for p in points))
    legend_rows = len(names)
    height = TOP + PLOT_HEIGHT + 48 + 16 * legend_rows
    parts = [_frame(title, unit, top, height)]
    for index, name in enumerate(names):
        colour = COLOURS[index % len(COLOURS)]
        mine = sorted((p for p in points if p.series == name), key=lambda p: p.x)
        line = " ".join(f"{column[p.x]:.1f},{_y(p.value, top):.1f}" for p in mine)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        parts += [_point(p, column[p.x], top, colour, unit) for p in mine]
        y = TOP + PLOT_HEIGHT + 44 + 16 * index
        parts.append(f'<rect x="{LEFT}" y="{y - 9}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{LEFT + 16}" y="{y}" class="legend">{escape(name)}</text>')
    parts += _x_labels(xs, column)
    return _svg(title, height, parts)


def bar_chart(title: str, unit: str, rows: list[tuple[str, float, float | None, str]], subtitle: str = "") -> str:
    """Horizontal bars, one per (label, measured, predicted or None, href): the bar is measured, the black
    mark the model's prediction."""
    top = _nice_top(max(max(m, p or 0.0) for _, m, p, _ in rows))
    bar, gap, label_width, first = 14, 6, 300, TOP + 16
    height = first + len(rows) * (bar + gap) + 40
    scale = (WIDTH - label_width - 24) / top
    parts = [f'<text x="8" y="18" class="title">{escape(title)}</text>']
    parts.append(f'<text x="8" y="34" class="tick">{escape(subtitle)}</text>')
    for index, (label, measured, predicted, href) in enumerate(rows):
        y = first + index * (bar + gap)
        tip = f"{label}\nmeasured {measured:.3g} {unit}" + (f", predicted {predicted:.3g} {unit}" if predicted else "")
        parts.append(
            f'<text x="{label_width - 6}" y="{y + bar - 3}" class="label" text-anchor="end">{escape(label)}</text>'
        )
        rect = f'<rect x="{label_width}" y="{y}" width="{measured * scale:.1f}" height="{bar}" fill="{COLOURS[0]}">'
        parts.append(_linked(href, f"{rect}<title>{escape(tip)}</title></rect>"))
        if predicted:
            x = label_width + predicted * scale
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y - 2}" y2="{y + bar + 2}" class="predicted"/>')
    axis_y = first + len(rows) * (bar + gap) + 14
    for tick in _ticks(top):
        x = label_width + tick * scale
        parts.append(f'<text x="{x:.1f}" y="{axis_y}" class="tick" text-anchor="middle">{tick:g}</text>')
    parts.append(f'<text x="{WIDTH - 8}" y="{axis_y + 16}" class="tick" text-anchor="end">{escape(unit)}</text>')
    return _svg(title, height, parts)


def _svg(title: str, height: float, parts: list[str]) -> str:
    body = "\n".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height:.0f}" '
        f'width="{WIDTH}" height="{height:.0f}" role="img" aria-label="{escape(title)}">\n{body}\n</svg>'
    )


def _frame(title: str, unit: str, top: float, height: float) -> str:
    lines = [f'<text x="8" y="18" class="title">{escape(title)} ({escape(unit)})</text>']  # the unit clear of ticks
    for tick in _ticks(top):
        y = _y(tick, top)
        lines.append(f'<line x1="{LEFT}" x2="{WIDTH - 8}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        lines.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_tick(tick)}</text>')
    return "\n".join(lines)


def _point(point: Point, x: float, top: float, colour: str, unit: str) -> str:
    y = _y(point.value, top)
    tip = f"{point.series}\n{point.x}: {point.value:.3g} {unit}"
    noise = ""
    if point.low is not None and point.high is not None:
        tip += f" (from {point.low:.3g} to {point.high:.3g})"
        low, high = _y(point.low, top), _y(point.high, top)
        noise = f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{low:.1f}" y2="{high:.1f}" stroke="{colour}" class="noise"/>'
    tip += f"\n{point.note}" if point.note else ""
    circle = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"><title>{escape(tip)}</title></circle>'
    return noise + _linked(point.href, circle)


def _linked(href: str, element: str) -> str:
    return f'<a href="{escape(href)}">{element}</a>' if href else element


def _x_labels(xs: list[str], column: dict[str, float]) -> list[str]:
    """At most 8 labels under the axis (the run's date and time), evenly spread."""
    every = max(1, -(-len(xs) // 8))
    y = TOP + PLOT_HEIGHT + 16
    labels = {x: escape(x[5:16].replace("T", " ")) for x in xs[::every]}  # MM-DD HH:MM of an ISO time
    return [
        f'<text x="{column[x]:.1f}" y="{y}" class="tick" text-anchor="middle">{t}</text>' for x, t in labels.items()
    ]


def _y(value: float, top: float) -> float:
    return TOP + PLOT_HEIGHT * (1 - value / top)


def _nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value * (1 - 1e-9))


def _tick(value: float) -> str:
    """A tick as a person reads it: thousands separated, never in scientific notation (1,000,000, not 1e+06)."""
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.3g}"


def _ticks(top: float) -> list[float]:
    return [top * i / 4 for i in range(5)]


@dataclass(frozen=True)
class Scatter:
    """One setup of a plan: its series (the card), wall time and cost, what its title says, whether it is on
    the Pareto front (a filled mark; off it, hollow)."""

    series: str
    x: float
    y: float
    note: str
    front: bool


def scatter_chart(title: str, x_unit: str, y_unit: str, points: list[Scatter]) -> str:
    """``y`` against ``x`` on a logarithmic x axis (wall time spans minutes to days), a colour per series; every
    mark predicted (the title says so), its numbers on hover and in the table beside the chart."""
    lows, highs = min(p.x for p in points), max(p.x for p in points)
    left, right = math.floor(math.log10(lows)), math.ceil(math.log10(highs))
    right += right == left
    top = _nice_top(max(p.y for p in points))
    names = list(dict.fromkeys(p.series for p in points))
    height = TOP + PLOT_HEIGHT + 48 + 16 * -(-len(names) // 4)
    span = WIDTH - LEFT - 24

    def x_of(value: float) -> float:
        return LEFT + span * (math.log10(value) - left) / (right - left)

    parts = [_frame(title, y_unit, top, height)]
    for decade in range(left, right + 1):
        x = x_of(10.0**decade)
        parts.append(f'<text x="{x:.1f}" y="{TOP + PLOT_HEIGHT + 16}" class="tick" text-anchor="middle">'
                     f"{10.0**decade:g} {escape(x_unit)}</text>")  # fmt: skip
    for index, name in enumerate(names):
        colour = COLOURS[index % len(COLOURS)]
        for p in (p for p in points if p.series == name):
            fill = colour if p.front else "none"
            tip = f"{p.note}\n{p.x:.3g} {x_unit}, {p.y:.3g} {y_unit} (predicted)"
            parts.append(
                f'<circle cx="{x_of(p.x):.1f}" cy="{_y(p.y, top):.1f}" r="4" fill="{fill}" stroke="{colour}">'
                f"<title>{escape(tip)}</title></circle>"
            )
        x, y = LEFT + 170 * (index % 4), TOP + PLOT_HEIGHT + 40 + 16 * (index // 4)
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{x + 16}" y="{y}" class="legend">{escape(name)}</text>')
    return _svg(title, height, parts)
