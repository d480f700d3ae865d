"""Scenario 4: how fast a change reaches ``sessions.snapshot``.

A daemon with its default flags serves its own generated home of background
receipts, all live. Each trial starts a ``sleep``, registers an exec for it
in the ownership store, writes its exec receipt with the writer kit and
waits until a ``sessions.snapshot`` reply lists the exec id (*written ->
visible*, timed from the return of the writer kit's call); then it kills the
process and waits until a reply no longer lists it (*killed -> gone*, timed
from the kill). The receipt is then removed, which changes no answer.

Two ways of waiting, in separate trials:

* **polling**: a plain ``sessions.snapshot`` every 2 ms: what a client that
  asks sees (a pending watcher change makes the daemon observe at once);
* **long poll**: ``sessions.snapshot`` with ``since`` the last generation,
  which the daemon answers when a new generation is published.

Before each kill (and, long-polling, before each write) the benchmark waits a
random part of a second (the default sample interval), so that the trials
do not lock onto the phase of anything periodic in the daemon. (An idle
daemon whose every exit is a pidfd event samples on no timer, and its
default ``max_age_ms`` then accepts the latest answer at any age.)
Scenario 10 times the same two events, asked back to back, with a tighter
target.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, report, require_modules
from benchmarks.homes import generate_home
from benchmarks.rawclient import RawClient, request_line
from benchmarks.scenarios.snapshot import wait_for_answer
from benchmarks.stats import complete_p99, fmt_s, latency_cell, summarize

if TYPE_CHECKING:
    from capsule_client.kit.store import OwnershipStore

__all__ = ["run"]

VISIBLE_TARGET_S = 0.050
DEADLINE_S = 5.0

_cell = partial(latency_cell, deadline_s=DEADLINE_S)
POLL_INTERVAL_S = 0.002
SAMPLE_INTERVAL_S = 1.0  # the daemon's default --sample-interval

Mode = Literal["polling", "long poll"]


class _Head(msgspec.Struct):
    generation: int
    discovery: str


class _Reply(msgspec.Struct):
    result: _Head


_head = msgspec.json.Decoder(_Reply)
_PLAIN = request_line("sessions.snapshot")


class _Waiter:
    """Waits for a condition on ``sessions.snapshot`` replies, polling or long-polling."""

    def __init__(self, client: RawClient, mode: Mode, generation: int) -> None:
        self.client = client
        self.mode = mode
        self.generation = generation

    def _ask(self, started: float) -> bytes | None:
        if self.mode == "polling":
            return self.client.request(_PLAIN)
        remaining_ms = int((started + DEADLINE_S - time.perf_counter()) * 1000)
        if remaining_ms <= 0:
            return None
        return self.client.request(
            request_line(
                "sessions.snapshot", {"since": self.generation, "timeout_ms": remaining_ms}
            )
        )

    def wait(self, until: Callable[[bytes], bool], started: float) -> float | None:
        """Seconds from ``started`` to the first ready reply for which ``until`` holds."""
        while time.perf_counter() < started + DEADLINE_S:
            reply = self._ask(started)
            if reply is None:
                break
            head = _head.decode(reply).result
            self.generation = head.generation
            if head.discovery == "ready" and until(reply):
                return time.perf_counter() - started
            if self.mode == "polling":
                time.sleep(POLL_INTERVAL_S)
        return None


def _trial(
    home: Path, waiter: _Waiter, store: OwnershipStore, trial: int, rng: random.Random
) -> tuple[float | None, float | None]:
    from capsule_client.kit.receipts import write_exec_receipt

    exec_id = f"exe_trial_{trial:04d}"
    marker = f'"exec_id":"{exec_id}"'.encode()
    store.register_exec(exec_id, "ses_0000")
    process = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
    jitter = waiter.mode == "long poll"
    try:
        if jitter:
            time.sleep(rng.uniform(0, SAMPLE_INTERVAL_S))
        path = write_exec_receipt(home, exec_id, process.pid, command=f"trial {trial}")
        visible_s = waiter.wait(lambda reply: marker in reply, time.perf_counter())
        time.sleep(rng.uniform(0, SAMPLE_INTERVAL_S))
        killed = time.perf_counter()
        process.kill()
        process.wait(timeout=10)
        gone_s = waiter.wait(lambda reply: marker not in reply, killed)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    path.unlink()
    return visible_s, gone_s


def run(ctx: Context) -> Outcome:
    """Time written -> visible and killed -> gone, polling and long-polling."""
    require_modules("capsuled.reader", "capsule_client.kit.receipts", "capsule_client.kit.store")
    from capsule_client.kit.paths import store_path
    from capsule_client.kit.store import OwnershipStore

    background = 100
    trials: dict[Mode, int] = {
        "polling": ctx.size(quick=4, full=100),
        "long poll": ctx.size(quick=2, full=30),
    }
    scratch = ctx.scratch("latency")
    home = generate_home(scratch / "home", background, ctx.sleep_pool()).home
    rng = random.Random(4)
    visible: dict[Mode, list[float]] = {"polling": [], "long poll": []}
    gone: dict[Mode, list[float]] = {"polling": [], "long poll": []}
    number = 0
    with (
        DaemonProcess(home, scratch / "d.sock", log_level="warning") as daemon,
        RawClient(daemon.socket_path) as client,
        OwnershipStore(store_path(home)) as store,
    ):
        generation = int(wait_for_answer(client, background, timeout_s=60.0)["generation"])
        for mode, count in trials.items():
            waiter = _Waiter(client, mode, generation)
            for _ in range(count):
                number += 1
                visible_s, gone_s = _trial(home, waiter, store, number, rng)
                if visible_s is not None:
                    visible[mode].append(visible_s)
                if gone_s is not None:
                    gone[mode].append(gone_s)
            generation = waiter.generation
    rows: list[list[str]] = []
    for mode, count in trials.items():
        rows.append(
            [f"receipt written -> visible ({mode})", _cell(visible[mode], count), str(count)]
        )
        rows.append([f"process killed -> gone ({mode})", _cell(gone[mode], count), str(count)])
        ctx.log(
            f"4: {mode}: visible {_cell(visible[mode], count)}; gone {_cell(gone[mode], count)}"
        )
    table = Table(
        columns=["change", "p50 / p99", "trials"],
        rows=rows,
    )
    polled = complete_p99(visible["polling"], trials["polling"])
    exits = gone["polling"]
    verdicts = [
        judge(
            "receipt written -> visible in sessions.snapshot: p99 <= 50 ms",
            "not every trial" if polled is None else f"p99 {fmt_s(polled)} (polling)",
            polled is not None and polled <= VISIBLE_TARGET_S,
        ),
        report(
            "process killed -> gone: report what sampling gives",
            f"p50 {fmt_s(summarize(exits).p50_s)}, p99 {fmt_s(summarize(exits).p99_s)} (polling)"
            if exits
            else "never",
        ),
    ]
    notes = [
        f"{background} background receipts; the daemon runs with its defaults "
        f"(`--sample-interval` {SAMPLE_INTERVAL_S:g} s). The pauses before the kills (and, "
        "long-polling, the writes) are random within it.",
        "Visible: from the return of `capsule_client.kit.receipts.write_exec_receipt` (temp file, "
        "fsync, rename, fsync of the directory) to the first reply listing the exec. "
        "Gone: from `kill()` to the first reply without it. Polling adds up to "
        f"{POLL_INTERVAL_S * 1000:g} ms of resolution.",
        "The target is judged on polling: the time until a `sessions.snapshot` request sees "
        "the receipt. The long-poll rows show when a waiting client is told.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
