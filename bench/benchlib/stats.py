"""Medians, spreads, ratios and formatting."""

import math
import statistics


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs):
    """min-max of the repetitions, as a string ('' for a single value)."""
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return ""
    return f"{fmt(min(xs))}–{fmt(max(xs))}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def percentile(xs, p):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def fmt(x, digits=3):
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1e7:
        return f"{x / 1e6:.1f}M"
    if a >= 1e4:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}g}" if a < 1 else f"{x:.2f}"


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"


def mb(kb):
    return None if kb is None else kb / 1024.0
