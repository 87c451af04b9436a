"""Minimal SVG line plots (no matplotlib): axes, ticks, labels, legend."""

import math
from xml.sax.saxutils import escape

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#000000", "#aec7e8", "#ffbb78", "#98df8a"]
# Fixed colours for the main configurations so that every plot reads the same way.
FIXED = {"glibc": "#d62728", "glibc-trim128k": "#ff9896", "glibc-arena2": "#8c564b",
         "glibc-malloc_trim": "#e377c2", "jemalloc": "#1f77b4", "tcmalloc": "#ff7f0e",
         "mimalloc": "#9467bd", "memshim": "#2ca02c"}


def nice_ticks(lo, hi, n=6):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while True:
        ticks.append(round(t, 10))
        if t >= hi - 1e-9:
            return ticks
        t += step


def line_plot(path, title, series, xlabel, ylabel, width=900, height=460, marks=None):
    """series: list of (name, [(x, y), ...]); marks: list of (x, text) vertical guides."""
    left, right, top, bottom = 70, 210, 40, 55
    pw, ph = width - left - right, height - top - bottom
    xs = [x for _, pts in series for x, _ in pts] or [0, 1]
    ys = [y for _, pts in series for _, y in pts] or [0, 1]
    xt = nice_ticks(min(0, min(xs)), max(xs))
    yt = nice_ticks(0, max(ys) * 1.05)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def X(x):
        return left + (x - x0) / (x1 - x0 or 1) * pw

    def Y(y):
        return top + ph - (y - y0) / (y1 - y0 or 1) * ph

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{left + pw / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{escape(title)}</text>']
    for t in yt:
        o.append(f'<line x1="{left}" x2="{left + pw}" y1="{Y(t):.1f}" y2="{Y(t):.1f}" stroke="#e5e5e5"/>')
        o.append(f'<text x="{left - 6}" y="{Y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in xt:
        o.append(f'<line x1="{X(t):.1f}" x2="{X(t):.1f}" y1="{top}" y2="{top + ph}" stroke="#f0f0f0"/>')
        o.append(f'<text x="{X(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{t:g}</text>')
    o.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    for x, text in marks or []:
        o.append(f'<line x1="{X(x):.1f}" x2="{X(x):.1f}" y1="{top}" y2="{top + ph}" stroke="#999" '
                 f'stroke-dasharray="4,3"/>')
        o.append(f'<text x="{X(x) + 3:.1f}" y="{top + 12}" fill="#666" font-size="11">{escape(text)}</text>')
    o.append(f'<text x="{left + pw / 2}" y="{height - 12}" text-anchor="middle">{escape(xlabel)}</text>')
    o.append(f'<text transform="translate(18,{top + ph / 2}) rotate(-90)" text-anchor="middle">'
             f'{escape(ylabel)}</text>')
    for i, (name, pts) in enumerate(series):
        color = FIXED.get(name, PALETTE[i % len(PALETTE)])
        wide = 2.6 if name == "memshim" else 1.5
        if pts:
            d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)
            o.append(f'<polyline fill="none" stroke="{color}" stroke-width="{wide}" points="{d}"/>')
        ly = top + 10 + i * 18
        o.append(f'<line x1="{left + pw + 12}" x2="{left + pw + 36}" y1="{ly}" y2="{ly}" stroke="{color}" '
                 f'stroke-width="{wide + 1}"/>')
        o.append(f'<text x="{left + pw + 42}" y="{ly + 4}">{escape(name)}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")
