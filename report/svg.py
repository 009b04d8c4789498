"""The compile report's charts, drawn as inline SVG: step lines (a search's best time so far),
horizontal bars (kernel times, e-graph sizes) and strips of dots (each finalist's timing rounds).
No scripts, fonts or files from anywhere else."""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

# colour-blind-safe (Okabe-Ito), in the order series get them
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")
FONT = 'font-family="system-ui, sans-serif" font-size="11"'


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]     # (x, y), x ascending; a NaN y is a gap before a first value
    color: str = PALETTE[0]


@dataclass
class Bar:
    label: str
    value: float
    text: str                             # printed after the bar
    color: str = PALETTE[0]


@dataclass
class Strip:
    label: str
    values: list[float]                   # one dot each
    mark: float                           # drawn as a tick across the strip (a median)
    color: str = PALETTE[0]


def ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round numbers covering [lo, hi]: steps of 1, 2 or 5 times a power of ten."""
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int(math.ceil((hi - first) / step - 1e-9)) + 1)]


def _labels(values: list[float]) -> list[str]:
    """Tick labels with the fewest significant digits (four at least) that tell them apart: a
    narrow range (6.0055 .. 6.0065 ms) needs more than a wide one."""
    for digits in range(4, 12):
        labels = [f"{v:.{digits}g}" for v in values]
        if len(set(labels)) == len(labels):
            return labels
    return labels


def step_chart(series: list[Series], title: str, x_label: str, y_label: str,
               width: int = 440, height: int = 240) -> str:
    """Each series as a step line (its value holds until the next point), on shared axes from 0."""
    left, right, top, bottom = 58, 12, 24, 40
    pts = [(x, y) for s in series for x, y in s.points if math.isfinite(y)]
    if not pts:
        return _empty(title, width, "no valid candidate yet")
    xt = ticks(0.0, max(x for x, _ in pts))
    lo, hi = min(y for _, y in pts), max(y for _, y in pts)
    # from 0 unless the values sit high above it; then the axis is cut, its labels say where
    yt = ticks(0.0 if lo < 0.5 * hi else lo - 0.15 * (hi - lo or hi), hi)

    def sx(x: float) -> float:
        return left + (width - left - right) * x / xt[-1]

    def sy(y: float) -> float:
        return height - bottom - (height - top - bottom) * (y - yt[0]) / (yt[-1] - yt[0])

    out = [_open(width, height, title),
           f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>']
    for v, label in zip(xt, _labels(xt)):
        out.append(f'<line x1="{sx(v):.1f}" y1="{top}" x2="{sx(v):.1f}" y2="{height - bottom}" '
                   f'stroke="#e4e4e4"/><text x="{sx(v):.1f}" y="{height - bottom + 14}" '
                   f'text-anchor="middle">{label}</text>')
    for v, label in zip(yt, _labels(yt)):
        out.append(f'<line x1="{left}" y1="{sy(v):.1f}" x2="{width - right}" y2="{sy(v):.1f}" '
                   f'stroke="#e4e4e4"/><text x="{left - 4}" y="{sy(v) + 4:.1f}" '
                   f'text-anchor="end">{label}</text>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    out.append(f'<text transform="translate(12 {(top + height - bottom) / 2}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    for s in series:
        path = _steps([(sx(x), sy(y)) for x, y in s.points if math.isfinite(y)])
        if path:
            out.append(f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="1.8"/>')
    if len(series) > 1:
        for i, s in enumerate(series):
            y = top + 4 + 14 * i
            out.append(f'<rect x="{width - right - 130}" y="{y}" width="10" height="3" fill="{s.color}"/>'
                       f'<text x="{width - right - 116}" y="{y + 5}">{escape(s.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _steps(points: list[tuple[float, float]]) -> str:
    coords = []
    for i, (x, y) in enumerate(points):
        if i:
            coords.append(f"{x:.1f},{points[i - 1][1]:.1f}")
        coords.append(f"{x:.1f},{y:.1f}")
    if len(points) == 1:                   # one point: a short tick, so that it shows
        x, y = points[0]
        coords.append(f"{x + 4:.1f},{y:.1f}")
    return " ".join(coords)


def bar_chart(bars: list[Bar], title: str, width: int = 720, label_width: int = 190) -> str:
    """One horizontal bar per row, scaled to the largest value, with its text after it."""
    if not bars:
        return _empty(title, width, "nothing to show")
    row, top, text_width = 16, 22, 150
    height = top + row * len(bars) + 6
    span = width - label_width - text_width
    biggest = max((b.value for b in bars if math.isfinite(b.value)), default=0.0) or 1.0
    out = [_open(width, height, title), f'<text x="0" y="14" font-weight="bold">{escape(title)}</text>']
    for i, b in enumerate(bars):
        y = top + i * row
        w = span * b.value / biggest if math.isfinite(b.value) and b.value > 0 else 0.0
        out.append(f'<text x="{label_width - 6}" y="{y + 11}" text-anchor="end">'
                   f'{escape(_clip(b.label, 32))}</text>'
                   f'<rect x="{label_width}" y="{y + 2}" width="{max(w, 1):.1f}" height="{row - 4}" '
                   f'fill="{b.color}"/><text x="{label_width + w + 4:.1f}" y="{y + 11}">'
                   f'{escape(b.text)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def strip_chart(strips: list[Strip], title: str, x_label: str, width: int = 720, label_width: int = 190) -> str:
    """One row per strip: each value a dot, its mark a tick. The axis spans the dots up to 1.5x
    the largest mark; a dot beyond it (a spell of load) sits on the right edge as a triangle."""
    values = [v for s in strips for v in s.values if math.isfinite(v)]
    if not values:
        return _empty(title, width, "nothing to show")
    row, top, right, bottom = 18, 22, 16, 34
    height = top + row * len(strips) + bottom
    xt = ticks(min(values), min(max(values), 1.5 * max(s.mark for s in strips)))

    def sx(x: float) -> float:
        return label_width + (width - label_width - right) * (x - xt[0]) / (xt[-1] - xt[0])

    out = [_open(width, height, title), f'<text x="0" y="14" font-weight="bold">{escape(title)}</text>']
    for v, label in zip(xt, _labels(xt)):
        out.append(f'<line x1="{sx(v):.1f}" y1="{top}" x2="{sx(v):.1f}" y2="{height - bottom}" stroke="#e4e4e4"/>'
                   f'<text x="{sx(v):.1f}" y="{height - bottom + 14}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{(label_width + width - right) / 2}" y="{height - 4}" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    for i, s in enumerate(strips):
        y = top + i * row + row / 2
        out.append(f'<text x="{label_width - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_clip(s.label, 32))}</text>')
        for v in s.values:
            if v > xt[-1]:
                x = sx(xt[-1])
                out.append(f'<polygon points="{x - 6:.1f},{y - 4:.1f} {x:.1f},{y:.1f} {x - 6:.1f},{y + 4:.1f}" '
                           f'fill="{s.color}"/>')
            elif math.isfinite(v):
                out.append(f'<circle cx="{sx(v):.1f}" cy="{y:.1f}" r="3" fill="{s.color}" fill-opacity="0.6"/>')
        if math.isfinite(s.mark):
            out.append(f'<line x1="{sx(s.mark):.1f}" y1="{y - 7:.1f}" x2="{sx(s.mark):.1f}" y2="{y + 7:.1f}" '
                       f'stroke="#000000" stroke-width="2"/>')
    out.append("</svg>")
    return "\n".join(out)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "\u2026"


def _open(width: int, height: int, title: str) -> str:
    return (f'<svg width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" {FONT}><title>{escape(title)}</title>')


def _empty(title: str, width: int, why: str) -> str:
    return (_open(width, 40, title) + f'<text x="0" y="14" font-weight="bold">{escape(title)}</text>'
            f'<text x="0" y="32" fill="#777">{escape(why)}</text></svg>')
