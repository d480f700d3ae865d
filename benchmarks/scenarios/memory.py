"""Scenario 7: the daemon's resident memory per retained receipt.

A daemon on an empty home gives the floor; a daemon on a generated home,
once its answer lists every receipt, gives the total. The difference per
receipt the reader retains (``cost.retained``) is what the target bounds.
Between two sizes, the slope shows the marginal cost of one more receipt.
"""

from __future__ import annotations

import time
from pathlib import Path

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


def _measure(ctx: Context, home: Path, receipts: int, name: str) -> tuple[int, int, int]:
    """(RSS, peak RSS, retained) once the daemon's answer lists every receipt."""
    scratch = ctx.scratch(name)
    with (
        DaemonProcess(home, scratch / "d.sock") as daemon,
        RawClient(daemon.socket_path) as client,
    ):
        snapshot = wait_for_answer(client, receipts, timeout_s=ctx.size(quick=30.0, full=600.0))
        time.sleep(ctx.size(quick=0.2, full=2.0))  # a few sampler observations
        rss = daemon.rss_bytes()
        return rss, _peak_bytes(daemon.pid), int(snapshot["cost"]["retained"])


def run(ctx: Context) -> Outcome:
    """RSS on an empty home and at each size; judge the bytes per retained receipt."""
    require_modules("capsuled.reader", "capsule_client.receipts", "capsule_client.store")
    sizes = ctx.size(quick=(1000,), full=(10_000, 100_000))
    empty = ctx.workdir / "empty-home"
    empty.mkdir(mode=0o700)
    floor, floor_peak, _ = _measure(ctx, empty, 0, "memory0")
    rows = [["0 (empty home)", fmt_bytes(floor), fmt_bytes(floor_peak), "—", "—"]]
    per_receipt: dict[int, float] = {}
    previous: tuple[int, int] | None = None
    for receipts in sizes:
        rss, peak, retained = _measure(ctx, ctx.home(receipts).home, receipts, f"memory{receipts}")
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
                fmt_bytes(peak),
                fmt_bytes(per_receipt[receipts]),
                slope,
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
        ],
        rows=rows,
    )
    settle_s = ctx.size(quick=0.2, full=2.0)
    notes = [
        "RSS (`VmRSS`) of the daemon process once `sessions.snapshot` is `ready` and lists every "
        f"receipt, then {settle_s} s of sampler observations; peak is `VmHWM`.",
        "Every receipt is live, so the latest answer (one process entry per receipt) is part of "
        "what is retained.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
