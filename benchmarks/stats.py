"""Percentiles and summaries of timing samples, and how numbers are shown.

Percentiles use the nearest-rank method: p99 of 1,000 samples is the 990th
smallest, a value that was really measured (no interpolation).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "LatencyTarget",
    "Summary",
    "complete_p99",
    "complete_summary",
    "fmt_bytes",
    "fmt_count",
    "fmt_ratio",
    "fmt_s",
    "latency_cell",
    "percentile",
    "summarize",
    "time_calls",
]


def percentile(samples: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``samples``.

    Args:
        samples: at least one value, in any order.
        p: the percentile, 0 < p <= 100.

    Returns:
        The smallest sample such that at least ``p`` % of the samples are <= it.

    Raises:
        ValueError: ``samples`` is empty or ``p`` is out of range.
    """
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 < p <= 100:
        raise ValueError(f"percentile must be in (0, 100], not {p}")
    ordered = sorted(samples)
    rank = math.ceil(p / 100 * len(ordered))
    return ordered[max(rank, 1) - 1]


@dataclass(frozen=True, slots=True)
class Summary:
    """Timing samples in seconds, summarized."""

    n: int
    p50_s: float
    p99_s: float
    min_s: float
    max_s: float
    mean_s: float


@dataclass(frozen=True, slots=True)
class LatencyTarget:
    """A latency target: p50 at most ``p50_s``, with a guard of p99 at most ``p99_s``.

    Both must hold for the target to be met.
    """

    p50_s: float
    p99_s: float

    def text(self) -> str:
        """``p50 <= 5 ms, p99 <= 15 ms``."""
        return f"p50 <= {fmt_s(self.p50_s)}, p99 <= {fmt_s(self.p99_s)}"

    def met(self, summary: Summary) -> bool:
        """Whether ``summary``'s p50 and p99 are both within the target."""
        return summary.p50_s <= self.p50_s and summary.p99_s <= self.p99_s


def summarize(samples_s: Sequence[float]) -> Summary:
    """p50, p99, min, max and mean of ``samples_s`` (seconds; at least one)."""
    return Summary(
        n=len(samples_s),
        p50_s=percentile(samples_s, 50),
        p99_s=percentile(samples_s, 99),
        min_s=min(samples_s),
        max_s=max(samples_s),
        mean_s=sum(samples_s) / len(samples_s),
    )


def time_calls(call: Callable[[], object], n: int, *, max_s: float | None = None) -> list[float]:
    """Call ``call`` ``n`` times; the wall time of each call in seconds.

    With ``max_s``, stop early once that many seconds have passed (at least
    one call is made); the caller reports how many samples it got.
    """
    clock = time.perf_counter
    samples: list[float] = []
    deadline = None if max_s is None else clock() + max_s
    for _ in range(n):
        started = clock()
        call()
        samples.append(clock() - started)
        if deadline is not None and started > deadline:
            break
    return samples


def fmt_s(seconds: float) -> str:
    """A duration with a unit that keeps three significant digits or so."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def fmt_ratio(ratio: float) -> str:
    """``12.3x``; large ratios without decimals."""
    if ratio >= 100:
        return f"{ratio:,.0f}x"
    if ratio >= 10:
        return f"{ratio:.1f}x"
    return f"{ratio:.2f}x"


def fmt_count(n: float) -> str:
    """``12,345`` (rounded to a whole number)."""
    return f"{n:,.0f}"


def fmt_bytes(n: float) -> str:
    """Bytes in B, KiB, MiB or GiB."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def latency_cell(samples: Sequence[float], trials: int, deadline_s: float) -> str:
    """``p50 / p99 (max)`` of the trials that ended within ``deadline_s``, and how many did not."""
    if not samples:
        return f"never within {deadline_s:.0f} s"
    summary = summarize(samples)
    text = f"{fmt_s(summary.p50_s)} / {fmt_s(summary.p99_s)} (max {fmt_s(summary.max_s)})"
    late = trials - len(samples)
    return text + (f"; {late} not within {deadline_s:.0f} s" if late else "")


def complete_summary(samples: Sequence[float], trials: int) -> Summary | None:
    """The summary when every one of ``trials`` gave a sample; None if any did not."""
    return summarize(samples) if samples and len(samples) == trials else None


def complete_p99(samples: Sequence[float], trials: int) -> float | None:
    """The p99 when every one of ``trials`` gave a sample; None if any did not."""
    summary = complete_summary(samples, trials)
    return None if summary is None else summary.p99_s
