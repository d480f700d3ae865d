"""Scenario 10: a receipt written or a process killed, until a plain snapshot shows it.

A daemon with its default flags serves its own generated home of 100 live
background receipts. Each trial registers an exec for a fresh ``sleep`` in
the ownership store and writes its exec receipt with the writer kit into a
hidden staging directory (temp file, fsync, rename, fsync: invisible to the
reader); after a pause,

* **written -> visible**: the clock starts just before the receipt is
  renamed into ``runtime/exec-processes``, and stops when a plain
  ``sessions.snapshot`` (no params: the default ``max_age_ms``) lists it,
  asked back to back on one connection;
* **killed -> gone**: the clock starts just before ``kill()`` (SIGKILL), and
  stops when such a reply no longer lists it.

Beside them, in the same trial, the floors of each event on this machine,
in the benchmark's own process: a bare inotify watch of a scratch directory
(a staged file renamed into it, until its event is read), and a bare pidfd
(``pidfd_open`` of a fresh ``sleep``, ``kill()``, until ``poll`` finds the
descriptor readable).
"""

from __future__ import annotations

import os
import random
import select
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from inotify_simple import INotify, flags

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, require_modules
from benchmarks.homes import generate_home
from benchmarks.rawclient import RawClient, request_line
from benchmarks.scenarios.snapshot import wait_for_answer
from benchmarks.stats import complete_p99, fmt_s, latency_cell

if TYPE_CHECKING:
    from capsule_client.store import OwnershipStore

__all__ = ["run"]

TARGET_S = 0.005
DEADLINE_S = 5.0
PAUSE_S = (0.030, 0.080)
FLOOR_PAUSE_S = (0.005, 0.015)
BACKGROUND = 100

_cell = partial(latency_cell, deadline_s=DEADLINE_S)
_PLAIN = request_line("sessions.snapshot")
_READY = b'"discovery":"ready"'


def _until(client: RawClient, holds: Callable[[bytes], bool], started: float) -> float | None:
    """Seconds from ``started`` to the first ready plain reply for which ``holds`` holds."""
    while time.perf_counter() < started + DEADLINE_S:
        reply = client.request(_PLAIN)
        if _READY in reply[:4096] and holds(reply):
            return time.perf_counter() - started
    return None


class _Floors:
    """The bare inotify and pidfd round trips, in this process."""

    def __init__(self, scratch: Path) -> None:
        self.staging = scratch / "floor-staging"
        self.watched = scratch / "floor-watched"
        self.staging.mkdir(mode=0o700)
        self.watched.mkdir(mode=0o700)
        self.inotify = INotify()
        self.inotify.add_watch(str(self.watched), flags.MOVED_TO)

    def inotify_round_trip(self, trial: int, rng: random.Random) -> float | None:
        staged = self.staging / f"f{trial}.json"
        staged.write_bytes(b"{}")
        time.sleep(rng.uniform(*FLOOR_PAUSE_S))
        target = self.watched / staged.name
        started = time.perf_counter()
        os.rename(staged, target)
        while time.perf_counter() < started + DEADLINE_S:
            if any(e.name == staged.name for e in self.inotify.read(timeout=int(DEADLINE_S * 1e3))):
                elapsed_s = time.perf_counter() - started
                target.unlink()
                return elapsed_s
        return None

    @staticmethod
    def pidfd_round_trip(rng: random.Random) -> float | None:
        process = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
        fd = os.pidfd_open(process.pid)
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            time.sleep(rng.uniform(*FLOOR_PAUSE_S))
            started = time.perf_counter()
            process.kill()
            ready = poller.poll(DEADLINE_S * 1000)
            elapsed_s = time.perf_counter() - started
        finally:
            os.close(fd)
            process.kill()
            process.wait(timeout=10)
        return elapsed_s if ready else None

    def close(self) -> None:
        self.inotify.close()


def _trial(
    home: Path,
    client: RawClient,
    store: OwnershipStore,
    trial: int,
    rng: random.Random,
) -> tuple[float | None, float | None]:
    from capsule_client.receipts import write_exec_receipt

    exec_id = f"exe_event_{trial:04d}"
    marker = f'"exec_id":"{exec_id}"'.encode()
    store.register_exec(exec_id, "ses_0000")
    process = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
    target = home / "runtime" / "exec-processes" / f"{exec_id}.json"
    try:
        staged = write_exec_receipt(home / ".staging", exec_id, process.pid)
        time.sleep(rng.uniform(*PAUSE_S))
        started = time.perf_counter()
        os.rename(staged, target)
        visible_s = _until(client, lambda reply: marker in reply, started)
        time.sleep(rng.uniform(*PAUSE_S))
        started = time.perf_counter()
        process.kill()
        gone_s = _until(client, lambda reply: marker not in reply, started)
    finally:
        process.kill()
        process.wait(timeout=10)
    target.unlink(missing_ok=True)
    return visible_s, gone_s


def run(ctx: Context) -> Outcome:
    """Time written -> visible and killed -> gone with plain requests; the floors beside."""
    require_modules("capsuled.watch.inotify", "capsuled.processes.exits", "capsule_client.receipts")
    from capsule_client.paths import store_path
    from capsule_client.store import OwnershipStore

    trials = ctx.size(quick=5, full=200)
    scratch = ctx.scratch("events")
    home = generate_home(scratch / "home", BACKGROUND, ctx.sleep_pool()).home
    rng = random.Random(10)
    visible: list[float] = []
    gone: list[float] = []
    floor_inotify: list[float] = []
    floor_pidfd: list[float] = []
    floors = _Floors(scratch)
    try:
        with (
            DaemonProcess(home, scratch / "d.sock", log_level="warning") as daemon,
            RawClient(daemon.socket_path) as client,
            OwnershipStore(store_path(home)) as store,
        ):
            wait_for_answer(client, BACKGROUND, timeout_s=60.0)
            exit_watch = client.call("status").get("exit_watch", "sampling")
            for trial in range(trials):
                for samples, value in zip(
                    (visible, gone), _trial(home, client, store, trial, rng), strict=True
                ):
                    if value is not None:
                        samples.append(value)
                if (value := floors.inotify_round_trip(trial, rng)) is not None:
                    floor_inotify.append(value)
                if (value := floors.pidfd_round_trip(rng)) is not None:
                    floor_pidfd.append(value)
    finally:
        floors.close()
    ctx.log(f"10: visible {_cell(visible, trials)}; gone {_cell(gone, trials)}")
    ctx.log(
        f"10: floors: inotify {_cell(floor_inotify, trials)}; pidfd {_cell(floor_pidfd, trials)}"
    )
    table = Table(
        columns=[
            "event",
            "daemon: plain sessions.snapshot, p50 / p99",
            "floor, p50 / p99",
            "trials",
        ],
        rows=[
            [
                "receipt renamed into place -> listed",
                _cell(visible, trials),
                f"{_cell(floor_inotify, trials)} (inotify event read)",
                str(trials),
            ],
            [
                "process killed -> not listed",
                _cell(gone, trials),
                f"{_cell(floor_pidfd, trials)} (pidfd readable)",
                str(trials),
            ],
        ],
    )
    visible_p99, gone_p99 = complete_p99(visible, trials), complete_p99(gone, trials)
    verdicts = [
        judge(
            "receipt written -> visible in a plain sessions.snapshot: p99 <= 5 ms",
            "not every trial" if visible_p99 is None else f"p99 {fmt_s(visible_p99)}",
            visible_p99 is not None and visible_p99 <= TARGET_S,
        ),
        judge(
            "process killed -> gone from a plain sessions.snapshot: p99 <= 5 ms",
            "not every trial" if gone_p99 is None else f"p99 {fmt_s(gone_p99)}",
            gone_p99 is not None and gone_p99 <= TARGET_S,
        ),
    ]
    notes = [
        f"{BACKGROUND} background receipts; the daemon runs with its default flags "
        f"(exit watch: {exit_watch}). Each trial's exec is registered in the store and its "
        "receipt written and fsynced in a hidden staging directory before a pause of "
        f"{PAUSE_S[0] * 1e3:.0f}-{PAUSE_S[1] * 1e3:.0f} ms (random); another pause comes "
        "before the kill.",
        "The client asks `sessions.snapshot` without params back to back on one connection "
        "(no sleep between requests) and reads each reply whole; the clock stops when the "
        "reply that shows the change has been read.",
        "Floors, in the benchmark's process, in the same trials: a staged file renamed into "
        "a scratch directory watched by a bare `inotify_simple` instance, until the "
        "blocking read returns its event; and `os.pidfd_open` of a fresh `sleep`, `kill()`, "
        "until `poll` finds the descriptor readable.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
