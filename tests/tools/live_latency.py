"""Measure receipt-to-notification and exit-to-notification latency (docs/sessions.md).

Not a test (pytest does not collect it): run by hand from the test venv,
``python tests/tools/live_latency.py [--rounds 200] [--pause-ms 50]``.

A real daemon samples every 60 s, so every notification comes from an event.
One client subscribes. Each round starts a ``sleep``, then

* **receipt**: times from just before its exec receipt is renamed into
  place (written and fsynced first by the writer kit in a hidden staging
  home, so the fsyncs are not counted) to the ``sessions.changed`` that adds
  it to its session;
* **exit**: times from just before ``SIGKILL`` to the ``sessions.changed``
  that removes the session.

Rounds are ``--pause-ms`` apart, more than the 20 ms a subscription waits
between two notifications, so each event is timed on its own.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The tests' helpers (tests/), and the daemon launcher they share with the benchmarks (the root).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.daemon import DaemonProcess, short_tmpdir

from capsule_client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import SessionsChanged

TARGETS_P99_MS = {"receipt": 50.0, "exit": 20.0}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def wait_for(changes: object, predicate: object) -> float:
    """Read notifications until ``predicate(change)``; returns the time it arrived."""
    while True:
        change: SessionsChanged = changes.next(timeout_s=5.0)  # type: ignore[attr-defined]
        if predicate(change):  # type: ignore[operator]
            return time.monotonic()


def measure(rounds: int, pause_s: float) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"receipt": [], "exit": []}
    with short_tmpdir() as tmp:
        home = tmp / "home"
        home.mkdir(mode=0o700)
        (home / "runtime/exec-processes").mkdir(mode=0o700, parents=True)
        staging = home / ".staging"  # hidden: invisible to the reader (docs/design.md §2)
        with OwnershipStore(store_path(home)) as store:
            for index in range(rounds):
                store.register_session(f"ses_{index}", context_id=None)
                store.register_exec(f"exe_{index}", f"ses_{index}")
        args = ["--sample-interval", "60", "--log-level", "warning"]
        with DaemonProcess(home, tmp / "d.sock", args), Client(tmp / "d.sock") as client:
            with client.subscribe() as changes:
                wait_for(changes, lambda c: c.full and not c.gaps)
                for index in range(rounds):
                    session = f"ses_{index}"
                    process = subprocess.Popen(["sleep", "300"])
                    time.sleep(pause_s)
                    # Written (and fsynced) where the reader does not look, then
                    # renamed into place: the receipt appears at the rename.
                    staged = write_exec_receipt(staging, f"exe_{index}", process.pid)
                    final = home / "runtime/exec-processes" / staged.name
                    started = time.monotonic()
                    os.rename(staged, final)
                    seen = wait_for(
                        changes,
                        lambda c, s=session: any(x.session_id == s for x in c.added),
                    )
                    results["receipt"].append((seen - started) * 1000)
                    time.sleep(pause_s)
                    started = time.monotonic()
                    os.kill(process.pid, signal.SIGKILL)
                    seen = wait_for(changes, lambda c, s=session: s in c.removed)
                    results["exit"].append((seen - started) * 1000)
                    process.wait()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--pause-ms", type=float, default=50.0)
    args = parser.parse_args()
    results = measure(args.rounds, args.pause_ms / 1000)
    failed = False
    for name, values in results.items():
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        target = TARGETS_P99_MS[name]
        verdict = "ok" if p99 <= target else "OVER TARGET"
        failed |= p99 > target
        print(
            f"{name:8} n={len(values)} p50={p50:.1f} ms p99={p99:.1f} ms "
            f"max={max(values):.1f} ms mean={statistics.fmean(values):.1f} ms "
            f"(target p99 <= {target:.0f} ms: {verdict})"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
