"""Scenarios 2 and 3: the cold scan against ``find | cat``, and one change against the cold scan.

Both use the reader library directly (``capsuled.reader.ActiveSessionReader``)
in the benchmark's process: it is the work the daemon does in a worker
thread, timed without the socket or the event loop around it. The page
cache is warm for the reader and for ``find`` alike (each runs once before
timing); nothing here measures the disk.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.harness import Context, Outcome, Table, judge, require_modules
from benchmarks.stats import fmt_bytes, fmt_count, fmt_ratio, fmt_s

__all__ = ["find_cat", "run_change", "run_cold"]

COLD_TARGET_RATIO = 3.0
CHANGE_TARGET_RATIO = 100.0


def _observe(reader: Any, receipts: int) -> tuple[float, Any]:
    """Time one observation; check that it is ready and retains every receipt."""
    started = time.perf_counter()
    observation = reader.observe()
    elapsed_s = time.perf_counter() - started
    snapshot = observation.snapshot
    if snapshot.discovery != "ready" or snapshot.cost.retained != receipts:
        raise RuntimeError(
            f"observation was {snapshot.discovery}, retained {snapshot.cost.retained} of "
            f"{receipts}: {snapshot.gaps[:3]}"
        )
    return elapsed_s, snapshot


def _cold_scan(home: Path, receipts: int) -> tuple[float, Any]:
    from capsuled.reader import ActiveSessionReader

    return _observe(ActiveSessionReader(home), receipts)


def find_cat(home: Path) -> float:
    """Seconds for `find HOME -name '*.json' -exec cat {} + >/dev/null`."""
    command = f"find '{home}' -name '*.json' -exec cat {{}} + >/dev/null"
    started = time.perf_counter()
    subprocess.run(command, shell=True, check=True)
    return time.perf_counter() - started


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _cost(snapshot: Any) -> str:
    cost = snapshot.cost
    return (
        f"{fmt_count(cost.directories)} dirs, {fmt_count(cost.receipts)} receipts, "
        f"{fmt_bytes(cost.bytes)}"
    )


def run_cold(ctx: Context) -> Outcome:
    """Scenario 2: a fresh reader's first observation, against ``find -exec cat``."""
    require_modules("capsuled.reader", "capsule_client.kit.receipts", "capsule_client.kit.store")
    sizes = ctx.size(quick=(1000,), full=(10_000, 100_000))
    trials = ctx.size(quick=1, full=3)
    rows: list[list[str]] = []
    ratios: dict[int, float] = {}
    for receipts in sizes:
        home = ctx.home(receipts).home
        find_cat(home)  # warm the page cache
        finds: list[float] = []
        scans: list[float] = []
        snapshot = None
        for _ in range(trials):
            finds.append(find_cat(home))
            elapsed_s, snapshot = _cold_scan(home, receipts)
            scans.append(elapsed_s)
        scan_s, find_s = _median(scans), _median(finds)
        ratios[receipts] = scan_s / find_s
        ctx.log(f"2: {receipts:,}: cold scan {fmt_s(scan_s)}, find+cat {fmt_s(find_s)}")
        rows.append(
            [
                fmt_count(receipts),
                fmt_s(scan_s),
                fmt_s(find_s),
                fmt_ratio(ratios[receipts]),
                _cost(snapshot),
            ]
        )
    verdicts = [
        judge(
            f"<= 3x the find+cat time ({receipts:,} receipts)",
            fmt_ratio(ratios[receipts]),
            ratios[receipts] <= COLD_TARGET_RATIO,
        )
        for receipts in sizes
    ]
    table = Table(
        columns=["receipts", "cold scan", "find + cat", "scan / find", "scan cost"],
        rows=rows,
    )
    notes = [
        "Cold scan: `ActiveSessionReader(home).observe()` on a new reader, in the benchmark's "
        "process: the walk, every receipt read and decoded, two process samples, the "
        "ownership query, the stability check and the projection.",
        f"Each cell is the median of {trials} run(s), the two alternating, page cache warm.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)


def _change_one(home: Path, exec_id: str, trial: int) -> Path:
    """Rewrite one exec receipt with the writer kit: same process, another command."""
    from capsule_client.kit.receipts import (
        decode_exec_receipt,
        exec_receipt_path,
        write_exec_receipt,
    )

    path = exec_receipt_path(home, exec_id)
    receipt = decode_exec_receipt(path.read_bytes())
    return write_exec_receipt(
        home,
        exec_id,
        receipt.pid,
        command=f"changed in trial {trial}",
        started_at_s=float(receipt.started_at),
    )


def _shows_command(snapshot: Any, exec_id: str, command: str) -> bool:
    data = msgspec.to_builtins(snapshot)
    for session in data["sessions"]:
        for process in session["processes"]:
            if process.get("exec_id") == exec_id:
                return bool(process.get("receipt_command") == command)
    return False


def run_change(ctx: Context) -> Outcome:
    """Scenario 3: one changed receipt among many, then the next observation."""
    require_modules("capsuled.reader", "capsule_client.kit.receipts", "capsule_client.kit.store")
    from capsuled.reader import ActiveSessionReader

    receipts = ctx.size(quick=1000, full=100_000)
    trials = ctx.size(quick=3, full=5)
    home = ctx.home(receipts).home
    # As in the daemon while its watcher runs: changes come from the feed alone.
    reader = ActiveSessionReader(home, trust_watcher=True)
    cold_s, cold = _observe(reader, receipts)
    _observe(reader, receipts)  # files written within the racy window are re-read once
    unchanged_s, unchanged = _observe(reader, receipts)
    changes: list[float] = []
    changed = None
    for trial in range(trials):
        exec_id = f"exe_{trial:07d}"
        path = _change_one(home, exec_id, trial)
        reader.changes.add([path])
        elapsed_s, changed = _observe(reader, receipts)
        if not _shows_command(changed, exec_id, f"changed in trial {trial}"):
            raise RuntimeError(f"the observation after the change did not show {exec_id}'s change")
        changes.append(elapsed_s)
    change_s = _median(changes)
    ratio = cold_s / change_s
    ctx.log(f"3: {receipts:,}: cold {fmt_s(cold_s)}, one change {fmt_s(change_s)}")
    table = Table(
        columns=["observation", "time", "cold / this", "cost"],
        rows=[
            ["cold scan (baseline)", fmt_s(cold_s), "1x", _cost(cold)],
            [
                f"one receipt changed (median of {trials})",
                fmt_s(change_s),
                fmt_ratio(ratio),
                _cost(changed),
            ],
            [
                "nothing changed",
                fmt_s(unchanged_s),
                fmt_ratio(cold_s / unchanged_s),
                _cost(unchanged),
            ],
        ],
    )
    verdicts = [
        judge(
            f">= 100x cheaper than the cold scan ({receipts:,} receipts)",
            fmt_ratio(ratio),
            ratio >= CHANGE_TARGET_RATIO,
        )
    ]
    notes = [
        f"One reader on a home of {receipts:,} receipts, in the benchmark's process "
        "(the reader library directly, so the time is the observation's own work; the "
        "daemon's `status` cost counters say what was read but not how long it took).",
        "Each trial rewrites one exec receipt with the writer kit (temp file, fsync, rename; "
        "not timed), tells the reader's change feed its path, as the watcher would, and "
        "times the next observation, which must show the new content.",
        "The reader trusts its change feed, as the daemon's does while a watcher runs "
        "(docs/watcher.md): unchanged receipts are not re-read or stat-checked, and "
        "liveness is re-decided only for processes that left the process table.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
