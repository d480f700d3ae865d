"""Scenario 7: the daemon's resident memory per retained receipt.

A daemon on an empty home gives the floor; a daemon on a generated home,
once its answer lists every receipt, gives the total. The difference per
receipt the reader retains (``cost.retained``) is what the target bounds.
Between two sizes, the slope shows the marginal cost of one more receipt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, require_modules
from benchmarks.rawclient import RawClient
from benchmarks.scenarios.snapshot import wait_for_answer
from benchmarks.stats import fmt_bytes, fmt_count

__all__ = ["run"]

TARGET_BYTES = 1024


def _peak_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass(frozen=True, slots=True)
class _Memory:
    rss: int
    peak: int
    retained: int
    idle_cpu: float  # CPU seconds per second while nothing changes


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _measure(ctx: Context, home: Path, receipts: int, name: str) -> _Memory:
    """Memory and idle CPU once the daemon's answer lists every receipt."""
    scratch = ctx.scratch(name)
    with (
        DaemonProcess(home, scratch / "d.sock", log_level="warning") as daemon,
        RawClient(daemon.socket_path) as client,
    ):
        snapshot = wait_for_answer(client, receipts, timeout_s=ctx.size(quick=30.0, full=600.0))
        settle_s = ctx.size(quick=0.3, full=3.0)
        cpu_before, started = _cpu_s(daemon.pid), time.monotonic()
        time.sleep(settle_s)  # nothing changing, no request
        idle_cpu = (_cpu_s(daemon.pid) - cpu_before) / (time.monotonic() - started)
        return _Memory(
            daemon.rss_bytes(), _peak_bytes(daemon.pid), int(snapshot["cost"]["retained"]), idle_cpu
        )


def run(ctx: Context) -> Outcome:
    """RSS on an empty home and at each size; judge the bytes per retained receipt."""
    require_modules("capsuled.reader", "capsule_client.kit.receipts", "capsule_client.kit.store")
    sizes = ctx.size(quick=(1000,), full=(10_000, 100_000))
    empty = ctx.workdir / "empty-home"
    empty.mkdir(mode=0o700)
    empty_home = _measure(ctx, empty, 0, "memory0")
    floor = empty_home.rss
    rows = [
        [
            "0 (empty home)",
            fmt_bytes(floor),
            fmt_bytes(empty_home.peak),
            "—",
            "—",
            f"{empty_home.idle_cpu:.0%}",
        ]
    ]
    per_receipt: dict[int, float] = {}
    previous: tuple[int, int] | None = None
    for receipts in sizes:
        measured = _measure(ctx, ctx.home(receipts).home, receipts, f"memory{receipts}")
        rss, retained = measured.rss, measured.retained
        per_receipt[receipts] = (rss - floor) / retained
        slope = "—"
        if previous is not None:
            slope = fmt_bytes((rss - previous[1]) / (retained - previous[0]))
        previous = (retained, rss)
        ctx.log(f"7: {receipts:,}: RSS {fmt_bytes(rss)}, {per_receipt[receipts]:.0f} B/receipt")
        rows.append(
            [
                fmt_count(retained),
                fmt_bytes(rss),
                fmt_bytes(measured.peak),
                fmt_bytes(per_receipt[receipts]),
                slope,
                f"{measured.idle_cpu:.0%}",
            ]
        )
    largest = sizes[-1]
    verdicts = [
        judge(
            f"<= 1 KiB per retained receipt ({largest:,} receipts)",
            f"{fmt_bytes(per_receipt[largest])} per receipt",
            per_receipt[largest] <= TARGET_BYTES,
        )
    ]
    table = Table(
        columns=[
            "retained receipts",
            "RSS",
            "peak RSS",
            "(RSS - empty) / retained",
            "slope from the size above",
            "idle CPU (of one core)",
        ],
        rows=rows,
    )
    settle_s = ctx.size(quick=0.3, full=3.0)
    notes = [
        "RSS (`VmRSS`) of the daemon process once `sessions.snapshot` is `ready` and lists every "
        f"receipt, then {settle_s} s with nothing changing; peak is `VmHWM`.",
        f"Idle CPU: the daemon's CPU time over those {settle_s} s, with no request and nothing "
        "changing, per second of wall time (counted in clock ticks of 10 ms: a coarse "
        "figure; scenario 9 measures the idle cost over longer windows).",
        "Every receipt is live, so the latest answer (one process entry per receipt) is part of "
        "what is retained.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
