"""Scenario 1: ``sessions.snapshot`` latency with nothing changing, against a naive walk.

For each size a daemon serves a generated home (every receipt live, sharing
~50 ``sleep`` processes). Once its answer is ``ready`` and lists every
receipt, one client sends the requests back to back and times each reply
(bytes in, bytes out: no client-side decoding). The naive baseline
(:mod:`benchmarks.naive`) runs in the benchmark's own process on the same
home, fewer times at large sizes because each query takes seconds.

Beside it, the transfer floor: after the daemon has stopped, a bare server
process (:mod:`benchmarks.reply_server`) answers the same client's requests
with the daemon's last reply, byte for byte, timed the same way. The daemon's
p50 minus the floor's p50 is the part of its time that is not moving the
reply's bytes. The targets are judged on the daemon's numbers alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from functools import partial
from typing import Any

import msgspec

from benchmarks.daemon import DaemonProcess, wait_for_socket
from benchmarks.harness import ROOT, Context, Outcome, Table, judge, require_modules
from benchmarks.naive import naive_live_receipts
from benchmarks.rawclient import RawClient, request_line
from benchmarks.stats import Summary, fmt_bytes, fmt_count, fmt_ratio, fmt_s, summarize, time_calls

__all__ = ["run", "wait_for_answer"]

P99_TARGET_S = 0.002
NAIVE_RATIO_TARGET = 100.0
GROWTH_TARGET = 1.5
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


def _measure_daemon(ctx: Context, receipts: int, requests: int) -> tuple[Summary, bytes, str]:
    home = ctx.home(receipts)
    scratch = ctx.scratch(f"snapshot{receipts}")
    with (
        DaemonProcess(home.home, scratch / "d.sock") as daemon,
        RawClient(daemon.socket_path) as client,
    ):
        first = wait_for_answer(client, receipts, timeout_s=ctx.size(quick=30.0, full=600.0))
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


def _measure_floor(ctx: Context, receipts: int, reply: bytes, requests: int) -> Summary:
    """The p50 and p99 of ``reply`` (plus ``\\n``) sent by a bare server to a :class:`RawClient`.

    Timed as the daemon's requests are: the same request line, from its send to
    the reply's last byte in the client's kept buffer.

    Raises:
        RuntimeError: the server did not start, or a reply was not ``reply``'s size.
    """
    scratch = ctx.scratch(f"floor{receipts}")
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


def _growth_note(sizes: tuple[int, ...], beyond_floor: dict[int, float]) -> str:
    first, last = beyond_floor[sizes[0]], beyond_floor[sizes[-1]]
    change = f"{_fmt_signed_s(first)} -> {_fmt_signed_s(last)}"
    if first > 0 and last > 0:
        change = f"{fmt_ratio(last / first)} ({change})"
    else:  # within the noise of the two p50s: a ratio would mean nothing
        change += ", no ratio: one of them is not above 0"
    return (
        f"Daemon p50 minus floor p50, {sizes[0]:,} -> {sizes[-1]:,} receipts: {change}. "
        "The growth target is still judged on the daemon's p50 alone."
    )


def run(ctx: Context) -> Outcome:
    """Daemon and naive latency at each size; judge p99, the ratio and the growth."""
    require_modules("capsuled.reader", "capsule_client.receipts", "capsule_client.store")
    sizes = ctx.size(quick=(200, 1000), full=(1000, 10_000, 100_000))
    requests = ctx.size(quick=200, full=1000)
    floor_requests = ctx.size(quick=100, full=300)
    naive_queries = ctx.size(quick={200: 20, 1000: 10}, full={1000: 100, 10_000: 20, 100_000: 5})
    rows: list[list[str]] = []
    daemon_p50: dict[int, float] = {}
    daemon_p99: dict[int, float] = {}
    ratios: dict[int, float] = {}
    beyond_floor: dict[int, float] = {}
    notes: list[str] = []
    for receipts in sizes:
        ours, reply, steady = _measure_daemon(ctx, receipts, requests)
        floor = _measure_floor(ctx, receipts, reply, floor_requests)
        beyond_floor[receipts] = ours.p50_s - floor.p50_s
        home = ctx.home(receipts).home
        found = naive_live_receipts(home)  # also warms the page cache
        if found != receipts:
            raise RuntimeError(f"the naive walk found {found} live receipts, not {receipts}")
        naive = summarize(time_calls(partial(naive_live_receipts, home), naive_queries[receipts]))
        ratio = naive.p50_s / ours.p50_s
        daemon_p50[receipts], daemon_p99[receipts], ratios[receipts] = (
            ours.p50_s,
            ours.p99_s,
            ratio,
        )
        ctx.log(
            f"1: {receipts:,} receipts: daemon p50 {fmt_s(ours.p50_s)} p99 {fmt_s(ours.p99_s)}, "
            f"naive p50 {fmt_s(naive.p50_s)} ({fmt_ratio(ratio)}), "
            f"floor p50 {fmt_s(floor.p50_s)} for {fmt_bytes(len(reply) + 1)}"
        )
        if steady != "steady":
            notes.append(f"At {receipts:,} receipts the answer moved while measured: {steady}.")
        rows.append(
            [
                fmt_count(receipts),
                fmt_bytes(len(reply)),
                f"{fmt_s(ours.p50_s)} / {fmt_s(ours.p99_s)} (n={ours.n})",
                f"{fmt_s(naive.p50_s)} / {fmt_s(naive.p99_s)} (n={naive.n})",
                fmt_ratio(ratio),
                f"{fmt_s(floor.p50_s)} (n={floor.n})",
                _fmt_signed_s(beyond_floor[receipts]),
            ]
        )
    at = min(sizes, key=lambda size: abs(size - 10_000))
    growth = daemon_p50[sizes[-1]] / daemon_p50[sizes[0]]
    worst = min(ratios, key=lambda size: ratios[size])
    verdicts = [
        judge(
            "p99 <= 2 ms at 10k receipts",
            f"{fmt_s(daemon_p99[at])} at {at:,}",
            daemon_p99[at] <= P99_TARGET_S,
        ),
        judge(
            ">= 100x faster than the naive p50",
            f"{fmt_ratio(ratios[worst])} at {worst:,} (lowest)",
            ratios[worst] >= NAIVE_RATIO_TARGET,
        ),
        judge(
            "p50 growth 1k -> 100k <= 1.5x",
            f"{fmt_ratio(growth)} from {sizes[0]:,} to {sizes[-1]:,}",
            growth <= GROWTH_TARGET,
        ),
    ]
    table = Table(
        columns=[
            "receipts",
            "reply size",
            "daemon p50 / p99",
            "naive p50 / p99",
            "naive / daemon (p50)",
            "transfer floor p50",
            "daemon p50 - floor p50",
        ],
        rows=rows,
    )
    notes += [
        f"Daemon: {requests} `sessions.snapshot` requests back to back on one connection after "
        "20 warm-up requests, default `max_age_ms`; timed from send to the reply's last byte, "
        "read into one buffer the client keeps (so the client's allocations are not timed). "
        f"A size stops early after {ctx.size(quick=10, full=180)} s (n says how many ran).",
        "Every receipt is live, so each answer lists every receipt's process: the reply grows "
        "with the home, and so does the time to encode and send it.",
        "Naive: one psutil sample, walk, `json.loads` and a start-time check per receipt; "
        "no ownership, no projection, no reply. It runs in the benchmark's process.",
        "Transfer floor: after the daemon has stopped, a bare server process "
        "(`benchmarks/reply_server.py`: no parsing, no encoding, no event loop) answers the "
        "same client's `sessions.snapshot` line with the daemon's last reply, byte for byte, "
        f"in one blocking `sendall`; {floor_requests} requests after 20 warm-up, timed as the "
        "daemon's are. It is what moving the reply's bytes costs; the daemon's p50 minus it "
        "is the rest of the daemon's time.",
        _growth_note(sizes, beyond_floor),
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
