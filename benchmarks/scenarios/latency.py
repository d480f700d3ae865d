"""Scenario 4: how fast a change reaches ``sessions.snapshot``.

A daemon serves its own generated home (background receipts, all live). Each
trial starts a ``sleep``, registers an exec for it in the ownership store,
writes its exec receipt with the writer kit and long-polls
``sessions.snapshot`` (``since`` the last generation) until the receipt's
exec id is listed: *written -> visible*, timed from the moment the writer
kit's call returns. Then it kills the process and long-polls until the exec
id is gone: *killed -> gone*, timed from the kill. The receipt file is then
removed, which changes no answer.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, report, require_modules
from benchmarks.homes import generate_home
from benchmarks.rawclient import RawClient, request_line
from benchmarks.scenarios.snapshot import wait_for_answer
from benchmarks.stats import Summary, fmt_s, summarize

__all__ = ["run"]

VISIBLE_TARGET_S = 0.050
DEADLINE_S = 5.0


class _Head(msgspec.Struct):
    generation: int
    discovery: str


class _Reply(msgspec.Struct):
    result: _Head


_head = msgspec.json.Decoder(_Reply)


def _wait(
    client: RawClient, since: int, until: Callable[[bytes], bool], started: float
) -> tuple[float | None, int]:
    """Long-poll from generation ``since`` until ``until(reply)``; (seconds or None, generation)."""
    while True:
        remaining_ms = int((started + DEADLINE_S - time.perf_counter()) * 1000)
        if remaining_ms <= 0:
            return None, since
        reply = client.request(
            request_line("sessions.snapshot", {"since": since, "timeout_ms": remaining_ms})
        )
        head = _head.decode(reply).result
        if head.discovery == "ready" and until(reply):
            return time.perf_counter() - started, head.generation
        since = head.generation


def _trial(
    home: Path, client: RawClient, store: object, since: int, trial: int
) -> tuple[float | None, float | None, int]:
    from capsule_client.receipts import write_exec_receipt

    exec_id = f"exe_trial_{trial:04d}"
    marker = f'"exec_id":"{exec_id}"'.encode()
    store.register_exec(exec_id, "ses_0000")  # type: ignore[attr-defined]
    process = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
    try:
        path = write_exec_receipt(home, exec_id, process.pid, command=f"trial {trial}")
        written = time.perf_counter()
        visible_s, since = _wait(client, since, lambda reply: marker in reply, written)
        killed = time.perf_counter()
        process.kill()
        process.wait(timeout=10)
        gone_s, since = _wait(client, since, lambda reply: marker not in reply, killed)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    path.unlink()
    return visible_s, gone_s, since


def _cell(summary: Summary | None, timeouts: int) -> str:
    if summary is None:
        return "never (every trial timed out)"
    text = f"{fmt_s(summary.p50_s)} / {fmt_s(summary.p99_s)} (max {fmt_s(summary.max_s)})"
    return text + (f", {timeouts} timed out after {DEADLINE_S:.0f} s" if timeouts else "")


def run(ctx: Context) -> Outcome:
    """Time written -> visible and killed -> gone over many trials."""
    require_modules("capsuled.reader", "capsule_client.receipts", "capsule_client.store")
    from capsule_client.paths import store_path
    from capsule_client.store import OwnershipStore

    background = ctx.size(quick=200, full=1000)
    trials = ctx.size(quick=5, full=200)
    scratch = ctx.scratch("latency")
    home = generate_home(scratch / "home", background, ctx.sleep_pool()).home
    visible: list[float] = []
    gone: list[float] = []
    with (
        DaemonProcess(home, scratch / "d.sock") as daemon,
        RawClient(daemon.socket_path) as client,
        OwnershipStore(store_path(home)) as store,
    ):
        since = int(wait_for_answer(client, background, timeout_s=60.0)["generation"])
        for trial in range(trials):
            visible_s, gone_s, since = _trial(home, client, store, since, trial)
            if visible_s is not None:
                visible.append(visible_s)
            if gone_s is not None:
                gone.append(gone_s)
    late_visible, late_gone = trials - len(visible), trials - len(gone)
    seen = summarize(visible) if visible else None
    left = summarize(gone) if gone else None
    ctx.log(f"4: visible {_cell(seen, late_visible)}; gone {_cell(left, late_gone)}")
    table = Table(
        columns=["change", "p50 / p99", "trials"],
        rows=[
            ["receipt written -> visible", _cell(seen, late_visible), str(trials)],
            ["process killed -> gone", _cell(left, late_gone), str(trials)],
        ],
    )
    visible_ok = seen is not None and late_visible == 0 and seen.p99_s <= VISIBLE_TARGET_S
    verdicts = [
        judge(
            "receipt written -> visible in sessions.snapshot: p99 <= 50 ms",
            "never" if seen is None else f"p99 {fmt_s(seen.p99_s)}",
            visible_ok,
        ),
        report(
            "process killed -> gone: report what sampling gives",
            "never" if left is None else f"p50 {fmt_s(left.p50_s)}, p99 {fmt_s(left.p99_s)}",
        ),
    ]
    notes = [
        f"The daemon runs with its defaults (sample interval 1 s) on a home of {background:,} "
        "live receipts.",
        "Visible: from the return of `capsule_client.receipts.write_exec_receipt` (temp file, "
        "fsync, rename, fsync of the directory) to the first `sessions.snapshot` reply listing "
        "the exec. Gone: from `kill()` to the first reply without it.",
        "Replies come from long polls (`since`), so the time includes no client polling delay.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
