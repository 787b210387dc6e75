"""Pure formatting and ranking helpers shared by the terminal and HTML reports.

Nothing here imports rich or matplotlib: every function maps numbers to strings or sorts
dicts, so it is unit-tested on plain values.
"""

from __future__ import annotations

import math
from typing import Any


def is_num(x: Any) -> bool:
    """True for a finite int/float (bool excluded): the values a report can print as a number."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fmt_seconds(s: Any) -> str:
    """Human time: 0.0123 -> '12.3 ms', 3.2e-5 -> '32.0 us', 2.5 -> '2.50 s'."""
    if not is_num(s):
        return "—"
    a = abs(s)
    if a >= 1.0:
        return f"{s:.2f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    if a == 0:
        return "0 ms"
    return f"{s * 1e6:.1f} us"


def fmt_ms(s: Any) -> str:
    """Seconds as a bare millisecond figure for table columns: 0.01234 -> '12.34'."""
    if not is_num(s):
        return "—"
    ms = s * 1e3
    return f"{ms:.3f}" if abs(ms) < 1 else f"{ms:.2f}" if abs(ms) < 100 else f"{ms:.1f}"


def fmt_bytes(b: Any) -> str:
    """Binary units: 1536 -> '1.5 KiB'."""
    if not is_num(b):
        return "—"
    value = float(b)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - loop always returns


def fmt_rate(x: Any, unit: str) -> str:
    """Throughput with SI prefixes: 12345.6, 'samples/s' -> '12.3k samples/s'."""
    if not is_num(x):
        return "—"
    for div, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{prefix} {unit}"
    return f"{x:.3g} {unit}" if abs(x) < 100 else f"{x:.0f} {unit}"


def fmt_share(x: Any) -> str:
    return f"{100 * x:.1f}%" if is_num(x) else "—"


def fmt_flops(x: Any) -> str:
    if not is_num(x):
        return "—"
    for div, prefix in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s")):
        if abs(x) >= div:
            return f"{x / div:.3g} {prefix}"
    return f"{x:.3g} FLOP/s"


def mfu_text(mfu: dict[str, Any] | None) -> str:
    """MFU with the peak it is measured against, or why there is no trustworthy figure.

    An MFU flagged invalid (e.g. > 100%, which means the FLOP count or the peak is wrong) is
    never printed as a result: it reads 'invalid: <note>'.
    """
    if not mfu or not is_num(mfu.get("value")):
        note = (mfu or {}).get("note")
        return f"not measured ({note})" if note else "not measured"
    if not mfu.get("valid", True):
        return f"invalid: {mfu.get('note') or 'flagged as a measurement error'}"
    peak = mfu.get("peak_name") or "unnamed peak"
    peak_flops = mfu.get("peak_flops")
    peak_txt = f"{peak}, {fmt_flops(peak_flops)}" if is_num(peak_flops) else peak
    return f"{100 * mfu['value']:.1f}% of peak ({peak_txt})"


def rank_findings(findings: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The doctor's order (telemetry/stakes.py): the share at stake first, then severity; a
    severity never lifts a finding with nothing at stake above one that can win time. Each
    carries "overlaps", so the shares shown without it add up to at most 100 %."""
    from trainspeed.telemetry.stakes import mark_overlaps, rank_key

    return mark_overlaps(sorted((f for f in findings or [] if isinstance(f, dict)), key=rank_key))


def ratio(a: Any, b: Any) -> float | None:
    """b / a, or None when either is missing or a is zero."""
    if not (is_num(a) and is_num(b)) or a == 0:
        return None
    return float(b) / float(a)


def verdict(r: float | None, *, higher_is_better: bool, noun: tuple[str, str] = ("faster", "slower")) -> str:
    """Read a B/A ratio as words: throughput 1.83 -> '1.83x faster'; a time 0.5 -> '2.00x faster'.

    `noun` is (better, worse), e.g. ('less', 'more') for memory.
    """
    if r is None or not is_num(r):
        return "—"
    if r == 0:
        return "—"
    better, worse = noun
    speedup = r if higher_is_better else 1.0 / r
    if abs(speedup - 1.0) < 0.005:
        return "same"
    return f"{speedup:.2f}x {better}" if speedup > 1 else f"{1 / speedup:.2f}x {worse}"
