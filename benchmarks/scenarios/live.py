"""Scenario 8: receipt written or process killed -> ``sessions.changed`` to a subscriber.

A daemon that samples only every 60 s (so every notification comes from an
event, not from the sampler) serves a generated home of background
receipts. One raw connection subscribes (``sessions.subscribe``) and reads
notifications. Each trial registers a session and an exec for a fresh
``sleep`` in the ownership store, then

* **receipt -> notification**: writes the exec receipt with the writer kit
  into a hidden staging directory (temp file, fsync, rename, fsync: invisible
  to the reader, docs/design.md §2) and times from just before it is renamed into
  ``runtime/exec-processes`` to the ``sessions.changed`` that adds the session;
* **exit -> notification**: times from just before ``kill()`` to the
  ``sessions.changed`` that removes it (the daemon holds a pidfd per watched
  process; where it has none, sampling notices and this misses).

A pause of 30-80 ms (random) comes before each event: more than the 20 ms a
subscription waits between two notifications, so each event is timed alone.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from functools import partial
from pathlib import Path

import msgspec

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, require_modules
from benchmarks.homes import generate_home
from benchmarks.rawclient import RawClient, request_line
from benchmarks.scenarios.snapshot import wait_for_answer
from benchmarks.stats import complete_p99, fmt_s, latency_cell

__all__ = ["run"]

RECEIPT_TARGET_S = 0.050
EXIT_TARGET_S = 0.020
DEADLINE_S = 5.0

_cell = partial(latency_cell, deadline_s=DEADLINE_S)
PAUSE_S = (0.030, 0.080)


class _Session(msgspec.Struct):
    session_id: str


class _Changed(msgspec.Struct):
    added: list[_Session] = []
    removed: list[str] = []


class _Message(msgspec.Struct):
    method: str | None = None
    params: _Changed | None = None


_message = msgspec.json.Decoder(_Message)


class _Subscriber:
    """One raw connection subscribed to ``sessions.changed``; reads whole lines."""

    def __init__(self, socket_path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(socket_path))
        self.buffer = bytearray()
        self.sock.sendall(request_line("sessions.subscribe"))
        self.next_line(DEADLINE_S)  # the reply; the full answer follows

    def next_line(self, timeout_s: float) -> bytes:
        self.sock.settimeout(timeout_s)
        while (end := self.buffer.find(b"\n")) < 0:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self.buffer += chunk
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 1]
        return line

    def wait(self, session_id: str, *, added: bool, started: float) -> float | None:
        """Seconds from ``started`` until a notification adds (or removes) ``session_id``."""
        while (remaining := started + DEADLINE_S - time.perf_counter()) > 0:
            try:
                line = self.next_line(remaining)
            except TimeoutError:
                return None
            arrived = time.perf_counter()
            params = _message.decode(line).params
            if params is None:
                continue
            if added and any(s.session_id == session_id for s in params.added):
                return arrived - started
            if not added and session_id in params.removed:
                return arrived - started
        return None

    def close(self) -> None:
        self.sock.close()


def run(ctx: Context) -> Outcome:
    """Time receipt -> notification and exit -> notification for one subscriber."""
    require_modules(
        "capsuled.discovery.subscriptions",
        "capsuled.processes.exits",
        "capsule_client.kit.receipts",
    )
    from capsule_client.kit.paths import store_path
    from capsule_client.kit.receipts import write_exec_receipt
    from capsule_client.kit.store import OwnershipStore

    background = 100
    trials = ctx.size(quick=3, full=200)
    scratch = ctx.scratch("live")
    home = generate_home(scratch / "home", background, ctx.sleep_pool()).home
    staging = home / ".staging"  # hidden: the reader never looks (docs/design.md §2)
    exec_dir = home / "runtime" / "exec-processes"
    rng = random.Random(8)
    receipt: list[float] = []
    exits: list[float] = []
    with (
        DaemonProcess(
            home, scratch / "d.sock", ["--sample-interval", "60"], log_level="warning"
        ) as daemon,
        RawClient(daemon.socket_path) as client,
        OwnershipStore(store_path(home)) as store,
    ):
        wait_for_answer(client, background, timeout_s=60.0)
        exit_watch = client.call("status").get("exit_watch", "sampling")
        subscriber = _Subscriber(daemon.socket_path)
        try:
            for trial in range(trials):
                session_id, exec_id = f"ses_live_{trial:04d}", f"exe_live_{trial:04d}"
                store.register_session(session_id, context_id=None)
                store.register_exec(exec_id, session_id)
                process = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
                try:
                    staged = write_exec_receipt(staging, exec_id, process.pid)
                    time.sleep(rng.uniform(*PAUSE_S))
                    started = time.perf_counter()
                    os.rename(staged, exec_dir / staged.name)
                    seen = subscriber.wait(session_id, added=True, started=started)
                    if seen is not None:
                        receipt.append(seen)
                    time.sleep(rng.uniform(*PAUSE_S))
                    started = time.perf_counter()
                    process.kill()
                    seen = subscriber.wait(session_id, added=False, started=started)
                    if seen is not None:
                        exits.append(seen)
                finally:
                    process.kill()
                    process.wait(timeout=10)
                (exec_dir / f"{exec_id}.json").unlink(missing_ok=True)
        finally:
            subscriber.close()
    ctx.log(f"8: receipt {_cell(receipt, trials)}; exit {_cell(exits, trials)}")
    table = Table(
        columns=["event -> sessions.changed", "p50 / p99", "trials"],
        rows=[
            ["receipt renamed into place -> added", _cell(receipt, trials), str(trials)],
            ["process killed -> removed", _cell(exits, trials), str(trials)],
        ],
    )
    receipt_p99, exit_p99 = complete_p99(receipt, trials), complete_p99(exits, trials)
    verdicts = [
        judge(
            "receipt -> notification: p99 <= 50 ms",
            "not every trial" if receipt_p99 is None else f"p99 {fmt_s(receipt_p99)}",
            receipt_p99 is not None and receipt_p99 <= RECEIPT_TARGET_S,
        ),
        judge(
            "exit -> notification: p99 <= 20 ms",
            "not every trial" if exit_p99 is None else f"p99 {fmt_s(exit_p99)}",
            exit_p99 is not None and exit_p99 <= EXIT_TARGET_S,
        ),
    ]
    notes = [
        f"{background} background receipts; the daemon runs with `--sample-interval 60`, so "
        f"every notification comes from an event (exit watch: {exit_watch}).",
        "Receipt: the writer kit writes and fsyncs the receipt in a hidden staging directory; "
        "the clock starts just before the rename into `runtime/exec-processes` and stops when "
        "the raw subscriber has read the notification line that adds the session.",
        "Exit: from just before `kill()` (SIGKILL) to the notification that removes the "
        "session; the parent reaps the process afterwards.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
