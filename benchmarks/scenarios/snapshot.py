"""Scenario 1: ``sessions.snapshot`` latency with nothing changing, against a naive walk.

Two kinds of home at each size. In the *all live* homes every receipt is
live (sharing ~50 ``sleep`` processes), so each answer lists every receipt
and the reply grows with the home: 16.5 MiB at 100k. The *realistic* homes
hold 100 live receipts among 1k, 10k or 100k stale ones (processes that
exited, pids reused), as a home looks after a while: the answer stays
small, and what grows is only what the daemon keeps.

For each home a daemon serves it. Once its answer is ``ready`` and lists
every live receipt, one client sends the requests back to back and times
each reply (bytes in, bytes out: no client-side decoding). The naive
baseline (:mod:`benchmarks.naive`) runs in the benchmark's own process on
the same home, fewer times at large sizes because each query takes seconds.

Beside it, the transfer floor: after the daemon has stopped, a bare server
process (:mod:`benchmarks.reply_server`) answers the same client's requests
with the daemon's last reply, byte for byte, timed the same way. The daemon's
p50 minus the floor's p50 is the part of its time that is not moving the
reply's bytes. The growth target is judged on the realistic homes' p50; the
all-live homes (their reply alone grows 100x) are judged on the daemon's p50
against the floor's at 10k and 100k receipts.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec

from benchmarks.daemon import DaemonProcess, wait_for_socket
from benchmarks.harness import ROOT, Context, Outcome, Table, judge, require_modules
from benchmarks.homes import GeneratedHome
from benchmarks.naive import naive_live_receipts
from benchmarks.rawclient import RawClient, request_line
from benchmarks.stats import Summary, fmt_bytes, fmt_count, fmt_ratio, fmt_s, summarize, time_calls

__all__ = ["run", "wait_for_answer"]

P99_TARGET_S = 0.002
#: All-live homes at 10k and 100k: the daemon's p50 at most this times the transfer floor's.
FLOOR_RATIO_TARGET = 1.25
GROWTH_TARGET = 1.5
REALISTIC_LIVE = 100
SNAPSHOT = request_line("sessions.snapshot")


def _count_processes(snapshot: dict[str, Any]) -> int:
    owned = sum(len(session["processes"]) for session in snapshot["sessions"])
    return owned + len(snapshot["unowned"])


def wait_for_answer(client: RawClient, receipts: int, timeout_s: float) -> dict[str, Any]:
    """Ask until the answer is ``ready`` and lists ``receipts`` processes.

    Raises:
        RuntimeError: not so after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot: dict[str, Any] = client.call(
            "sessions.snapshot", {"timeout_ms": int(min(timeout_s, 60) * 1000)}
        )
        if snapshot["discovery"] == "ready" and _count_processes(snapshot) == receipts:
            return snapshot
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"no ready answer listing {receipts} processes after {timeout_s} s: "
                f"{snapshot['discovery']}, {_count_processes(snapshot)} processes, "
                f"gaps {snapshot['gaps'][:3]}"
            )
        time.sleep(0.05)


def _measure_daemon(ctx: Context, home: GeneratedHome, requests: int) -> tuple[Summary, bytes, str]:
    scratch = ctx.scratch(f"snapshot{home.live}s{home.stale}")
    with (
        DaemonProcess(home.home, scratch / "d.sock", log_level="warning") as daemon,
        RawClient(daemon.socket_path) as client,
    ):
        first = wait_for_answer(client, home.live, timeout_s=ctx.size(quick=30.0, full=600.0))
        for _ in range(min(20, requests)):  # warm-up
            client.request(SNAPSHOT)
        errors: list[bytes] = []

        def one() -> None:
            reply = client.request_view(SNAPSHOT)
            if b'"result":' not in bytes(reply[:64]):
                errors.append(bytes(reply[:200]))

        samples = time_calls(one, requests, max_s=ctx.size(quick=10.0, full=180.0))
        last_reply = client.request(SNAPSHOT)
        last = msgspec.json.decode(last_reply)["result"]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(samples)} replies were errors: {errors[0]!r}")
    steady = "steady"
    if last["generation"] != first["generation"] or last["discovery"] != "ready":
        steady = f"generation {first['generation']} -> {last['generation']}, {last['discovery']}"
    return summarize(samples), last_reply, steady


def _measure_floor(ctx: Context, name: str, reply: bytes, requests: int) -> Summary:
    """The p50 and p99 of ``reply`` (plus ``\\n``) sent by a bare server to a :class:`RawClient`.

    Timed as the daemon's requests are: the same request line, from its send to
    the reply's last byte in the client's kept buffer.

    Raises:
        RuntimeError: the server did not start, or a reply was not ``reply``'s size.
    """
    scratch = ctx.scratch(f"floor{name}")
    reply_file = scratch / "reply.json"
    reply_file.write_bytes(reply + b"\n")
    socket_path = scratch / "r.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.reply_server", str(socket_path), str(reply_file)],
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        wait_for_socket(socket_path, server, timeout_s=10.0, ping=False)
        with RawClient(socket_path) as client:
            for _ in range(min(20, requests)):  # warm-up; the client's buffer grows here
                client.request_view(SNAPSHOT).release()
            wrong: list[int] = []

            def one() -> None:
                with client.request_view(SNAPSHOT) as got:
                    if len(got) != len(reply):
                        wrong.append(len(got))

            samples = time_calls(one, requests, max_s=ctx.size(quick=5.0, full=15.0))
    finally:
        server.kill()
        server.wait(timeout=10)
    if wrong:
        raise RuntimeError(f"the floor's server sent {wrong[0]} bytes, not {len(reply)}")
    return summarize(samples)


def _fmt_signed_s(seconds: float) -> str:
    return f"-{fmt_s(-seconds)}" if seconds < 0 else fmt_s(seconds)


@dataclass(frozen=True, slots=True)
class _Row:
    """One home's figures."""

    home: GeneratedHome
    reply_bytes: int
    ours: Summary
    naive: Summary
    floor: Summary

    @property
    def size(self) -> int:
        """The size it stands for: stale receipts in a realistic home, else all receipts."""
        return self.home.stale if self.home.stale else self.home.receipts

    @property
    def ratio(self) -> float:
        return self.naive.p50_s / self.ours.p50_s

    @property
    def beyond_floor_s(self) -> float:
        return self.ours.p50_s - self.floor.p50_s

    def cells(self) -> list[str]:
        return [
            fmt_count(self.size),
            fmt_bytes(self.reply_bytes),
            f"{fmt_s(self.ours.p50_s)} / {fmt_s(self.ours.p99_s)} (n={self.ours.n})",
            f"{fmt_s(self.naive.p50_s)} / {fmt_s(self.naive.p99_s)} (n={self.naive.n})",
            fmt_ratio(self.ratio),
            f"{fmt_s(self.floor.p50_s)} (n={self.floor.n})",
            _fmt_signed_s(self.beyond_floor_s),
        ]


_COLUMNS = [
    "reply size",
    "daemon p50 / p99",
    "naive p50 / p99",
    "naive / daemon (p50)",
    "transfer floor p50",
    "daemon p50 - floor p50",
]


def _measure(ctx: Context, home: GeneratedHome, naive_queries: int, notes: list[str]) -> _Row:
    requests = ctx.size(quick=200, full=1000)
    floor_requests = ctx.size(quick=100, full=300)
    ours, reply, steady = _measure_daemon(ctx, home, requests)
    floor = _measure_floor(ctx, f"{home.live}s{home.stale}", reply, floor_requests)
    found = naive_live_receipts(home.home)  # also warms the page cache
    if found != home.live:
        raise RuntimeError(f"the naive walk found {found} live receipts, not {home.live}")
    naive = summarize(time_calls(partial(naive_live_receipts, home.home), naive_queries))
    row = _Row(home, len(reply), ours, naive, floor)
    what = f"{home.live:,} live" + (f" among {home.stale:,} stale" if home.stale else "")
    ctx.log(
        f"1: {what}: daemon p50 {fmt_s(ours.p50_s)} p99 {fmt_s(ours.p99_s)}, "
        f"naive p50 {fmt_s(naive.p50_s)} ({fmt_ratio(row.ratio)}), "
        f"floor p50 {fmt_s(floor.p50_s)} for {fmt_bytes(len(reply) + 1)}"
    )
    if steady != "steady":
        notes.append(f"With {what} receipts the answer moved while measured: {steady}.")
    return row


def _floor_ratio(rows: list[_Row]) -> tuple[str, bool]:
    """The all-live homes of 10k receipts and more: daemon p50 / floor p50, the text and
    the verdict."""
    judged = [row for row in rows if row.size >= 10_000] or rows[-1:]
    ratios = [(row, row.ours.p50_s / row.floor.p50_s) for row in judged]
    text = ", ".join(
        f"{fmt_ratio(ratio)} at {row.size:,} ({fmt_s(row.ours.p50_s)} / {fmt_s(row.floor.p50_s)})"
        for row, ratio in ratios
    )
    return text, all(ratio <= FLOOR_RATIO_TARGET for _, ratio in ratios)


def run(ctx: Context) -> Outcome:
    """Daemon and naive latency at each size, all live and realistic; judge p99, ratio, growth."""
    require_modules("capsuled.reader", "capsule_client.kit.receipts", "capsule_client.kit.store")
    sizes = ctx.size(quick=(200, 1000), full=(1000, 10_000, 100_000))
    naive_queries = ctx.size(quick={200: 20, 1000: 10}, full={1000: 100, 10_000: 20, 100_000: 5})
    naive_realistic = ctx.size(quick={200: 10, 1000: 5}, full={1000: 50, 10_000: 10, 100_000: 3})
    notes: list[str] = []
    live = [_measure(ctx, ctx.home(n), naive_queries[n], notes) for n in sizes]
    realistic = [
        _measure(ctx, ctx.home(REALISTIC_LIVE, stale=n), naive_realistic[n], notes) for n in sizes
    ]
    at = min(live, key=lambda row: abs(row.size - 10_000))
    growth = realistic[-1].ours.p50_s / realistic[0].ours.p50_s
    floor_text, floor_ok = _floor_ratio(live)
    verdicts = [
        judge(
            "p99 <= 2 ms at 10k receipts",
            f"{fmt_s(at.ours.p99_s)} at {at.size:,}, all live",
            at.ours.p99_s <= P99_TARGET_S,
        ),
        judge(
            "p50 growth 1k -> 100k <= 1.5x (100 live among 1k -> 100k stale)",
            f"{fmt_ratio(growth)} from {sizes[0]:,} to {sizes[-1]:,} stale "
            f"({fmt_s(realistic[0].ours.p50_s)} -> {fmt_s(realistic[-1].ours.p50_s)})",
            growth <= GROWTH_TARGET,
        ),
        judge(
            "all live: daemon p50 <= 1.25x the transfer floor's at 10k and 100k receipts",
            floor_text,
            floor_ok,
        ),
    ]
    tables = [
        Table(columns=["receipts, all live", *_COLUMNS], rows=[row.cells() for row in live]),
        Table(
            columns=[f"stale receipts (+ {REALISTIC_LIVE} live)", *_COLUMNS],
            rows=[row.cells() for row in realistic],
        ),
    ]
    requests = ctx.size(quick=200, full=1000)
    floor_requests = ctx.size(quick=100, full=300)
    notes += [
        f"Daemon: {requests} `sessions.snapshot` requests back to back on one connection after "
        "20 warm-up requests, default `max_age_ms`; timed from send to the reply's last byte, "
        "read into one buffer the client keeps (so the client's allocations are not timed). "
        f"A size stops early after {ctx.size(quick=10, full=180)} s (n says how many ran).",
        "First table: every receipt is live, so each answer lists every receipt's process: the "
        "reply grows with the home, and so does the time to encode and send it. Second table: "
        f"{REALISTIC_LIVE} live receipts among that many stale ones (half name a process that "
        "exited, half a running process with another start time): the answer lists "
        f"{REALISTIC_LIVE} processes at every size.",
        "Naive: one psutil sample, walk, `json.loads` and a start-time check per receipt; "
        "no ownership, no projection, no reply. It runs in the benchmark's process.",
        "Transfer floor: after the daemon has stopped, a bare server process "
        "(`benchmarks/reply_server.py`: no parsing, no encoding, no event loop) answers the "
        "same client's `sessions.snapshot` line with the daemon's last reply, byte for byte, "
        f"in one blocking `sendall`; {floor_requests} requests after 20 warm-up, timed as the "
        "daemon's are. It is what moving the reply's bytes costs; the daemon's p50 minus it "
        "is the rest of the daemon's time.",
        "Growth is judged on the realistic homes' p50; the all-live homes, whose reply grows "
        "100x, on the daemon's p50 against the transfer floor's at 10k and 100k receipts. "
        "The naive ratio is shown, not judged.",
    ]
    return Outcome(tables=tables, verdicts=verdicts, notes=notes)
