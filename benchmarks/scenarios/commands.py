"""Scenario 17: ``sessions.snapshot`` with and without ``commands: true``, 100 live among 10k.

One daemon serves the realistic home of scenario 1 (100 live receipts among
10k stale ones). Once its answer lists the 100, one client sends
``sessions.snapshot`` requests back to back, in blocks that alternate the
plain request and the one with ``commands: true``, and times each reply.
The plain answer is the published one, encoded once; the one with commands
is a copy whose processes carry their argv (kept per (pid, start), each
process's stat line re-read at most once a second for an ``exec``), encoded
for the request.

Also checked: the plain reply is the reply with commands less its
``command`` members, byte for byte once re-encoded, so asking for commands
changes nothing for those who do not.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import msgspec

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, report, require_modules
from benchmarks.rawclient import RawClient, request_line
from benchmarks.scenarios.snapshot import REALISTIC_LIVE, wait_for_answer
from benchmarks.stats import fmt_bytes, fmt_s, summarize, time_calls

__all__ = ["run"]

PLAIN = request_line("sessions.snapshot")
COMMANDS = request_line("sessions.snapshot", {"commands": True})
P99_TARGET_S = 0.002


def _without_commands(result: dict[str, Any]) -> dict[str, Any]:
    for process in [*(p for s in result["sessions"] for p in s["processes"]), *result["unowned"]]:
        process.pop("command", None)
    return result


def run(ctx: Context) -> Outcome:
    """p50 / p99 of the plain and the commands snapshot; the plain reply unchanged."""
    require_modules("capsuled.processes.argv", "capsule_client.kit.receipts")
    stale = ctx.size(quick=1000, full=10_000)
    home = ctx.home(REALISTIC_LIVE, stale=stale)
    blocks = ctx.size(quick=4, full=10)
    per_block = ctx.size(quick=50, full=100)
    samples: dict[bytes, list[float]] = {PLAIN: [], COMMANDS: []}
    with (
        DaemonProcess(home.home, ctx.scratch("commands") / "d.sock", log_level="warning") as daemon,
        RawClient(daemon.socket_path) as client,
    ):
        wait_for_answer(client, home.live, timeout_s=ctx.size(quick=30.0, full=600.0))
        for line in (PLAIN, COMMANDS):  # warm-up: the argv of every process read once
            for _ in range(20):
                client.request(line)
        for _ in range(blocks):
            for line in (PLAIN, COMMANDS):
                samples[line] += time_calls(partial(client.request_view, line), per_block)
        plain = msgspec.json.decode(client.request(PLAIN))["result"]
        named = msgspec.json.decode(client.request(COMMANDS))["result"]
    processes = [p for s in named["sessions"] for p in s["processes"]] + named["unowned"]
    with_argv = sum(1 for p in processes if isinstance(p.get("command"), list))
    encode = msgspec.json.encode
    same = encode(_without_commands(named)["sessions"]) == encode(plain["sessions"])
    ours = {line: summarize(found) for line, found in samples.items()}
    sizes = {PLAIN: len(encode(plain)), COMMANDS: len(encode(named))}
    rows = [
        [
            name,
            fmt_bytes(sizes[line]),
            f"{fmt_s(ours[line].p50_s)} / {fmt_s(ours[line].p99_s)} (n={ours[line].n})",
        ]
        for name, line in (("without commands", PLAIN), ("commands: true", COMMANDS))
    ]
    ctx.log(
        f"17: p50 plain {fmt_s(ours[PLAIN].p50_s)}, with commands {fmt_s(ours[COMMANDS].p50_s)}"
    )
    verdicts = [
        report(
            f"snapshot p50 with and without commands at {stale:,} receipts, {REALISTIC_LIVE} live",
            f"{fmt_s(ours[PLAIN].p50_s)} without, {fmt_s(ours[COMMANDS].p50_s)} with "
            f"({with_argv} of {len(processes)} processes with an argv)",
        ),
        judge(
            "p99 <= 2 ms with commands",
            fmt_s(ours[COMMANDS].p99_s),
            ours[COMMANDS].p99_s <= P99_TARGET_S,
        ),
        judge(
            "the answer without commands is the answer with them less `command`",
            "identical" if same else "differs",
            same,
        ),
    ]
    notes = [
        f"{blocks} blocks of {per_block} plain requests then {per_block} with "
        "`commands: true`, back to back on one connection after 20 warm-up requests of "
        "each, default `max_age_ms`; timed as in scenario 1.",
        "The argv of each listed process is read once per (pid, start); a request with "
        "commands re-reads the stat line of each at most once a second (in a worker thread) "
        "to notice an `exec`, and otherwise answers from memory on the event loop.",
    ]
    return Outcome(
        tables=[Table(columns=["request", "reply size", "daemon p50 / p99"], rows=rows)],
        verdicts=verdicts,
        notes=notes,
    )
