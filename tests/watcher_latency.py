"""Measure the watcher's write-to-feed latency and idle CPU (docs/watcher.md).

Not a test (pytest does not collect it): run by hand,
``python tests/watcher_latency.py [--writes 200] [--step-ms 10] [--mode native]``.
Each write is a receipt written like the writer kit (``.name.tmp`` + rename)
from a worker thread; latency runs from just before the rename to the moment
the watcher adds the path to the feed.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import anyio

from capsuled.changes import ChangeFeed
from capsuled.watcher import HomeWatcher


class TimedFeed(ChangeFeed):
    """A feed that remembers when each path was first added."""

    def __init__(self) -> None:
        super().__init__()
        self.added_at: dict[Path, float] = {}
        self.arrived = anyio.Event()
        self.batches = 0

    def add(self, paths: Iterable[Path]) -> None:
        now = time.monotonic()
        self.batches += 1
        paths = list(paths)
        for path in paths:
            self.added_at.setdefault(path, now)
        super().add(paths)
        self.arrived.set()  # the watcher feeds on the event loop


def write_receipt(path: Path) -> float:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text('{"schema_version": 1}')
    before = time.monotonic()
    os.replace(temp, path)
    return before


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        receipts = home / "runtime" / "exec-processes"
        receipts.mkdir(parents=True)
        feed = TimedFeed()
        watcher = HomeWatcher(
            home,
            feed,
            mode=args.mode,
            step_ms=args.step_ms,
            debounce_ms=args.debounce_ms,
            poll_delay_ms=args.poll_delay_ms,
        )
        latencies_ms: list[float] = []
        async with anyio.create_task_group() as tg:
            await tg.start(watcher.serve)
            cpu_before, wall_before = cpu_s(), time.monotonic()
            await anyio.sleep(args.idle_s)
            idle_cpu = (cpu_s() - cpu_before) / (time.monotonic() - wall_before)
            for n in range(args.writes):
                path = receipts / f"exec_{n}.json"
                feed.arrived = anyio.Event()
                before = await anyio.to_thread.run_sync(write_receipt, path)
                with anyio.fail_after(5):
                    while path not in feed.added_at:
                        await feed.arrived.wait()
                        feed.arrived = anyio.Event()
                latencies_ms.append((feed.added_at[path] - before) * 1000)
                await anyio.sleep(random.uniform(0, args.gap_ms / 1000))
            burst = [receipts / f"burst_{n}.json" for n in range(args.burst)]
            feed.batches = 0
            burst_started = time.monotonic()
            await anyio.to_thread.run_sync(lambda: [write_receipt(path) for path in burst])
            written_s = time.monotonic() - burst_started
            with anyio.fail_after(30):
                while not all(path in feed.added_at for path in burst):
                    await feed.arrived.wait()
                    feed.arrived = anyio.Event()
            burst_ms = (max(feed.added_at[path] for path in burst) - burst_started) * 1000
            tg.cancel_scope.cancel()
    latencies_ms.sort()
    p99 = latencies_ms[min(len(latencies_ms) - 1, int(len(latencies_ms) * 0.99))]
    print(
        f"mode={watcher.mode} step_ms={args.step_ms} debounce_ms={args.debounce_ms} "
        f"writes={len(latencies_ms)} p50={statistics.median(latencies_ms):.1f} ms "
        f"p99={p99:.1f} ms max={latencies_ms[-1]:.1f} ms idle_cpu={idle_cpu * 100:.2f} %"
    )
    print(
        f"burst of {args.burst} receipts: written in {written_s * 1000:.0f} ms, "
        f"all fed after {burst_ms:.0f} ms, in {feed.batches} batches"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--mode", choices=["native", "polling"], default="native")
    parser.add_argument("--step-ms", type=int, default=10)
    parser.add_argument("--debounce-ms", type=int, default=50)
    parser.add_argument("--poll-delay-ms", type=int, default=200)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--burst", type=int, default=1000, help="receipts written at once")
    parser.add_argument(
        "--gap-ms", type=int, default=20, help="pause between writes: uniform in [0, gap-ms]"
    )
    anyio.run(measure, parser.parse_args())


if __name__ == "__main__":
    main()
