"""Scenario 5: ``session.reconcile`` of a generated trace, against ``grep -c``.

The trace (:mod:`benchmarks.traces`) is generated once; each trial copies it
into a fresh session directory of the daemon's home (flushed to disk before
timing, so that reconcile's own ``fsync`` of its markers does not flush the
copy), runs ``grep -c shell_detached`` on the copy, then asks the daemon to
reconcile it and checks that the report lists exactly the work the
generator left unaccounted. The page cache is warm for both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import msgspec

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, require_modules
from benchmarks.rawclient import RawClient, request_line
from benchmarks.stats import fmt_bytes, fmt_ratio, fmt_s
from benchmarks.traces import generate_trace

__all__ = ["run"]

TARGET_RATIO = 3.0


def _copy_flushed(source: Path, session_dir: Path) -> Path:
    session_dir.mkdir(mode=0o700)
    target = session_dir / "trace.jsonl"
    shutil.copyfile(source, target)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return target


def _grep(path: Path) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(
        ["grep", "-c", "shell_detached", str(path)], capture_output=True, check=True
    )
    return time.perf_counter() - started, int(done.stdout)


def _reconcile(client: RawClient, from_session: str, trial: int) -> tuple[float, list[str]]:
    line = request_line(
        "session.reconcile",
        {"from_session": from_session, "this_session": f"ses_next_{trial}", "context_id": "ctx"},
    )
    started = time.perf_counter()
    reply = client.request(line)
    elapsed_s = time.perf_counter() - started
    result = msgspec.json.decode(reply)
    if "error" in result:
        raise RuntimeError(f"session.reconcile failed: {result['error']}")
    report = result["result"] or {"lost": []}
    return elapsed_s, [work["work_id"] for work in report["lost"]]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def run(ctx: Context) -> Outcome:
    """Time reconcile and grep on the same copies; judge the ratio."""
    require_modules("capsuled.reconcile", "capsule_client.trace")
    size_bytes = ctx.size(quick=4_000_000, full=100_000_000)
    trials = ctx.size(quick=1, full=3)
    scratch = ctx.scratch("reconcile")
    source = scratch / "trace.jsonl"
    started = time.monotonic()
    expected = generate_trace(source, size_bytes)
    actual_bytes = source.stat().st_size
    ctx.log(f"5: generated {fmt_bytes(actual_bytes)} in {time.monotonic() - started:.1f} s")
    home = scratch / "home"
    sessions = home / "sessions"
    sessions.mkdir(mode=0o700, parents=True)
    greps: list[float] = []
    reconciles: list[float] = []
    matches = 0
    with (
        DaemonProcess(home, scratch / "d.sock") as daemon,
        RawClient(daemon.socket_path) as client,
    ):
        for trial in range(trials):
            session = f"ses_bench_{trial}"
            copy = _copy_flushed(source, sessions / session)
            grep_s, matches = _grep(copy)
            reconcile_s, lost = _reconcile(client, session, trial)
            if lost != expected:
                raise RuntimeError(
                    f"reconcile reported {len(lost)} lost works, the generator left "
                    f"{len(expected)} unaccounted"
                )
            greps.append(grep_s)
            reconciles.append(reconcile_s)
            shutil.rmtree(sessions / session)
    grep_s, reconcile_s = _median(greps), _median(reconciles)
    ratio = reconcile_s / grep_s
    ctx.log(f"5: reconcile {fmt_s(reconcile_s)}, grep {fmt_s(grep_s)} ({fmt_ratio(ratio)})")
    mb = actual_bytes / 1e6
    table = Table(
        columns=["trace", "session.reconcile", "grep -c", "reconcile / grep"],
        rows=[
            [
                f"{fmt_bytes(actual_bytes)}, {len(expected)} lost works",
                f"{fmt_s(reconcile_s)} ({mb / reconcile_s:,.0f} MB/s)",
                f"{fmt_s(grep_s)} ({mb / grep_s:,.0f} MB/s, {matches} lines)",
                fmt_ratio(ratio),
            ]
        ],
    )
    verdicts = [judge("<= 3x grep", fmt_ratio(ratio), ratio <= TARGET_RATIO)]
    notes = [
        f"Median of {trials} trial(s), each on a fresh copy of the trace. Reconcile is timed "
        "over the socket: the request, the locked scan, one write of the markers, their fsync, "
        "the report.",
        "grep's count includes the lines that only mention `shell_detached` inside a string; "
        "reconcile must not count those, and the report is checked against the generator.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
