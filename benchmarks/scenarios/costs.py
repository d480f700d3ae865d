"""Scenario 21: what asking a session's cost costs, and what ended sessions cost idle.

**Snapshot with usage and ports.** One daemon with its default flags serves a
home where 10 sessions own, by store rows, 100 (then 600) live ``sleep``
processes; every tenth holds a listening TCP socket of its own, inherited
from the benchmark (so ``ports`` finds one socket in each of them and none in
the others). Once the answer lists them, one client sends
``sessions.snapshot`` back to back, in blocks that alternate four requests:
plain, ``usage: true``, ``ports: true``, and both. The plain answer is the
published one, encoded once; ``usage`` measures every listed process
(psutil, in a worker thread); ``ports`` lists every listed process's
descriptors and asks the kernel once for the namespace's listening sockets
(sock_diag; in a worker thread). Also checked: with ``ports``, every listed
process carries ``ports`` and the listening ones carry their socket.

**Ended sessions' leftovers, nothing changing.** Three daemons with their
default flags, measured side by side in the same window from ``/proc``
(:mod:`benchmarks.procstat`): one on a home where 10 sessions each ran a root
that started two ``sleep`` processes and exited (so each session is
``ended``, its two leftovers its only processes), one where the same
sessions still run (their roots alive), one on an empty home. A session's
state comes from what observations already know: the leftovers are
descendants, which the daemon looks for once a second while any exist, as
for a running session; the ended home should cost no more than the running
one, and observe no more often.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, report, require_modules
from benchmarks.procstat import IdleWindow, process_count
from benchmarks.rawclient import RawClient, request_line
from benchmarks.stats import fmt_s, summarize, time_calls

__all__ = ["run"]

SESSIONS = 10
#: One session process in this many holds a listening socket.
LISTENING_EVERY = 10
REQUESTS = {
    "plain": request_line("sessions.snapshot"),
    "usage: true": request_line("sessions.snapshot", {"usage": True}),
    "ports: true": request_line("sessions.snapshot", {"ports": True}),
    "usage and ports": request_line("sessions.snapshot", {"usage": True, "ports": True}),
}
#: How much more CPU the ended home's daemon may show than the running one's: two clock
#: ticks over the window (``utime + stime`` counts whole ticks).
TICKS_OF_SLACK = 2
LEFT_PER_SESSION = 2


def _register(home: Path, owned: dict[str, list[int]]) -> None:
    from capsule_client.kit.paths import store_path
    from capsule_client.kit.store import OwnershipStore

    with OwnershipStore(store_path(home)) as store:
        for session_id, pids in owned.items():
            store.ensure_session(session_id)
            for pid in pids:
                store.register_process(pid, session_id)


def _listed(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for s in answer["sessions"] for p in s["processes"]]


def _until(client: RawClient, check: Any, timeout_s: float) -> dict[str, Any]:
    """Long-poll with ``since`` until ``check(answer)``."""
    answer: dict[str, Any] = client.call("sessions.snapshot")
    deadline = time.monotonic() + timeout_s
    while not check(answer):
        if time.monotonic() > deadline:
            raise RuntimeError("the daemon's answer did not change in time")
        answer = client.call(
            "sessions.snapshot", {"since": answer["generation"], "timeout_ms": 10_000}
        )
    return answer


@contextmanager
def _sleeps(count: int) -> Iterator[tuple[list[subprocess.Popen[bytes]], dict[int, int]]]:
    """``count`` sleeps; every :data:`LISTENING_EVERY`-th holds a listening socket:
    (the processes, pid → its socket's port)."""
    processes: list[subprocess.Popen[bytes]] = []
    ports: dict[int, int] = {}
    try:
        for n in range(count):
            if n % LISTENING_EVERY:
                processes.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL))
                continue
            with socket.socket() as listening:
                listening.bind(("127.0.0.1", 0))
                listening.listen()
                process = subprocess.Popen(
                    ["sleep", "3600"], stdin=subprocess.DEVNULL, pass_fds=[listening.fileno()]
                )
                ports[process.pid] = listening.getsockname()[1]
            processes.append(process)
        yield processes, ports
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.wait(timeout=10)


def _requests(ctx: Context, count: int) -> tuple[dict[str, list[float]], int, bool]:
    """Samples of each request at ``count`` session processes; the machine's processes;
    whether the ports answer was right."""
    home = ctx.scratch(f"costs-{count}") / "home"
    home.mkdir(mode=0o700)
    blocks = ctx.size(quick=2, full=10)
    per_block = ctx.size(quick=5, full=50 if count <= 100 else 20)  # 600: a request is slow
    samples: dict[str, list[float]] = {name: [] for name in REQUESTS}
    with _sleeps(count) as (processes, ports):
        pids = [p.pid for p in processes]
        _register(home, {f"ses_{i:02d}": pids[i::SESSIONS] for i in range(SESSIONS)})
        machine = process_count()
        with (
            DaemonProcess(home, home.parent / "d.sock", log_level="warning") as daemon,
            RawClient(daemon.socket_path) as client,
        ):
            _until(client, lambda a: len(_listed(a)) >= count, timeout_s=60.0)
            for line in REQUESTS.values():  # warm-up: every process measured once
                for _ in range(5):
                    client.request(line)
            for _ in range(blocks):
                for name, line in REQUESTS.items():
                    samples[name] += time_calls(partial(client.request_view, line), per_block)
            answer = client.call("sessions.snapshot", {"ports": True})
    found = {p["pid"]: p.get("ports") for p in _listed(answer)}
    right = len(found) == count and all(
        found[pid]
        == ([{"proto": "tcp", "address": "127.0.0.1", "port": ports[pid]}] if pid in ports else [])
        for pid in pids
    )
    return samples, machine, right


def _observations(client: RawClient) -> int:
    """Observations so far less the verification runs (each one an observation of its
    own, every 30 s by default, whatever the sessions)."""
    totals = client.call("status")["totals"]
    return int(totals["observations"]) - int(totals["verifications"])


@dataclass
class _Idle:
    """One idle window of three daemons: ``ended``, ``running`` and ``empty``."""

    figures: dict[str, Any]
    window_s: float
    #: Observations in the window less verification runs, by daemon (not ``empty``).
    observations: dict[str, int]
    ended_sessions: int


def _trees(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` roots, each starting :data:`LEFT_PER_SESSION` sleeps and waiting for a line."""
    sleeps = " & ".join(["sleep 3600"] * LEFT_PER_SESSION)
    return [
        subprocess.Popen(["sh", "-c", f"{sleeps} & read x"], stdin=subprocess.PIPE, process_group=0)
        for _ in range(count)
    ]


def _home(ctx: Context, name: str, roots: list[subprocess.Popen[bytes]]) -> Path:
    home = ctx.scratch(name) / "home"
    home.mkdir(mode=0o700)
    _register(home, {f"ses_{i:02d}": [root.pid] for i, root in enumerate(roots)})
    return home


def _ended_idle(ctx: Context) -> _Idle:
    """Three daemons over one window: :data:`SESSIONS` ended sessions with their
    leftovers, the same sessions still running, an empty home."""
    window_s = ctx.size(quick=0.5, full=30.0)
    ending, running = _trees(SESSIONS), _trees(SESSIONS)
    want = SESSIONS * (LEFT_PER_SESSION + 1)
    try:
        homes = {
            "ended": _home(ctx, "costs-ended", ending),
            "running": _home(ctx, "costs-running", running),
            "empty": _home(ctx, "costs-empty", []),
        }
        with ExitStack() as stack:
            daemons = {
                name: stack.enter_context(
                    DaemonProcess(home, home.parent / "d.sock", log_level="warning")
                )
                for name, home in homes.items()
            }
            with RawClient(daemons["running"].socket_path) as client:
                _until(client, lambda a: len(_listed(a)) >= want, timeout_s=60.0)
            with RawClient(daemons["ended"].socket_path) as client:
                _until(client, lambda a: len(_listed(a)) >= want, timeout_s=60.0)
                for root in ending:
                    assert root.stdin is not None
                    root.stdin.close()  # the root reads EOF and exits: its sleeps are left
                    root.wait(timeout=10)
                answer = _until(
                    client,
                    lambda a: sum(s["state"] == "ended" for s in a["sessions"]) == SESSIONS,
                    timeout_s=60.0,
                )
            time.sleep(ctx.size(quick=0.3, full=3.0))  # the exits' tail
            watched = ("ended", "running")
            before = {}
            for name in watched:
                with RawClient(daemons[name].socket_path) as client:
                    before[name] = _observations(client)
            figures = IdleWindow({name: d.pid for name, d in daemons.items()}).measure(window_s)
            observations = {}
            for name in watched:
                with RawClient(daemons[name].socket_path) as client:
                    observations[name] = _observations(client) - before[name]
    finally:
        for root in [*ending, *running]:
            try:
                os.killpg(root.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            root.wait(timeout=10)
            if root.stdin is not None:
                root.stdin.close()
    ended_sessions = sum(s["state"] == "ended" for s in answer["sessions"])
    return _Idle(figures, window_s, observations, ended_sessions)


def run(ctx: Context) -> Outcome:
    """p50 / p99 of the four requests at 100 and 600 session processes; the idle window."""
    require_modules("capsuled.processes.ports", "capsule_client.kit.store")
    sizes = ctx.size(quick=(10, 30), full=(100, 600))
    rows: list[list[str]] = []
    verdicts = []
    right_everywhere = True
    for count in sizes:
        samples, machine, right = _requests(ctx, count)
        right_everywhere &= right
        ours = {name: summarize(found) for name, found in samples.items()}
        for name in REQUESTS:
            rows.append(
                [
                    f"{count} ({machine} on the machine)",
                    name,
                    f"{fmt_s(ours[name].p50_s)} / {fmt_s(ours[name].p99_s)} (n={ours[name].n})",
                ]
            )
        ctx.log(
            f"21: {count} processes: p50 "
            + ", ".join(f"{name} {fmt_s(ours[name].p50_s)}" for name in REQUESTS)
        )
        verdicts.append(
            report(
                f"snapshot p50 with and without usage and ports at {count} session processes",
                ", ".join(f"{name} {fmt_s(ours[name].p50_s)}" for name in REQUESTS),
            )
        )
    verdicts.append(
        judge(
            "with ports, every process carries its listening socket and no other",
            "right" if right_everywhere else "wrong",
            right_everywhere,
        )
    )
    idle = _ended_idle(ctx)
    figures = idle.figures
    ended, running, empty = figures["ended"], figures["running"], figures["empty"]
    ctx.log(
        f"21: ended leftovers: {ended.cpu_percent:.3f} %, {ended.wakeups_per_s:.2f}/s, "
        f"{idle.observations['ended']} observations; running: {running.cpu_percent:.3f} %, "
        f"{running.wakeups_per_s:.2f}/s, {idle.observations['running']} observations"
    )
    slack_percent = TICKS_OF_SLACK * 100 / (idle.window_s * os.sysconf("SC_CLK_TCK"))
    verdicts.append(
        judge(
            f"{SESSIONS} ended sessions' leftovers, nothing changing: no more CPU (within "
            f"{TICKS_OF_SLACK} clock ticks) and no more observations than the same sessions "
            "running",
            f"{ended.cpu_percent:.3f} % (schedstat {ended.runtime_percent:.3f} %), "
            f"{ended.wakeups_per_s:.2f} wake-ups/s, {idle.observations['ended']} observations; "
            f"running: {running.cpu_percent:.3f} %, {running.wakeups_per_s:.2f} wake-ups/s, "
            f"{idle.observations['running']} observations",
            ended.cpu_percent <= running.cpu_percent + slack_percent
            and idle.observations["ended"] <= idle.observations["running"],
        )
    )
    rows_idle = [
        [
            f"{idle.ended_sessions} ended sessions, {LEFT_PER_SESSION} leftovers each",
            f"{ended.cpu_percent:.3f} % / {ended.runtime_percent:.3f} %",
            f"{ended.wakeups_per_s:.2f}",
            str(idle.observations["ended"]),
        ],
        [
            f"{SESSIONS} running sessions, a root and {LEFT_PER_SESSION} children each",
            f"{running.cpu_percent:.3f} % / {running.runtime_percent:.3f} %",
            f"{running.wakeups_per_s:.2f}",
            str(idle.observations["running"]),
        ],
        [
            "empty",
            f"{empty.cpu_percent:.3f} % / {empty.runtime_percent:.3f} %",
            f"{empty.wakeups_per_s:.2f}",
            "-",
        ],
    ]
    tables = [
        Table(columns=["session processes", "request", "daemon p50 / p99"], rows=rows),
        Table(
            columns=[
                "home",
                "daemon CPU: ticks / schedstat",
                "daemon wake-ups/s",
                "observations but verification's",
            ],
            rows=rows_idle,
        ),
    ]
    notes = [
        f"{SESSIONS} sessions own the `sleep` processes by store rows; one in "
        f"{LISTENING_EVERY} holds a listening TCP socket. Each request is timed as in "
        "scenario 1, in blocks that alternate the four, on one connection after five "
        "warm-up requests of each; default `max_age_ms` (the plain answer is the "
        "published one).",
        "`usage` measures each listed process with psutil (CPU since the daemon last "
        "measured it, RSS), `ports` lists each one's descriptors (two stat reads around "
        "them) and asks the kernel once for the namespace's listening sockets "
        "(sock_diag, as `ss`); both in a worker thread, for each request.",
        f"Idle: three daemons with their default flags, measured in the same "
        f"{idle.window_s:g} s window: {SESSIONS} sessions whose roots exited (each left "
        f"{LEFT_PER_SESSION} `sleep`s), the same sessions with their roots alive, an "
        "empty home. Leftovers are descendants, looked for once a second as a running "
        "session's are (the pid counter read, and a probe of the pids handed out since "
        "when something forked anywhere on the machine); an ended session's state needs no "
        "work of its own. CPU is `utime + stime` (clock ticks) / the threads' schedstat run "
        "time; wake-ups are the context switches of every thread. Observations exclude "
        "the verification runs (every 30 s).",
    ]
    return Outcome(tables=tables, verdicts=verdicts, notes=notes)
