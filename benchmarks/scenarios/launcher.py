"""Scenario 18: `capsulectl run`'s fixed cost, the waiting launcher's memory, and an orphan
found under it (docs/design.md §10).

**Fixed cost.** ``capsulectl run --session S -- true`` against ``true``, each
started and waited for by the benchmark, alternating, with a daemon serving the
home (the launcher's ping, its registration and its look at CMD's exit are in
the figure) and with none (one warning, no look).

**RSS.** The launcher's ``VmRSS`` while its CMD (``sleep``) runs.

**Orphan -> listed.** CMD is a small Python process that, for each line on its
stdin, reads the monotonic clock and runs ``sh -c 'sleep 300 & echo $!'``:
the shell exits at once, so the sleep is re-parented to the launcher (a child
subreaper). The benchmark long-polls ``sessions.snapshot`` with ``since`` until
an answer lists the sleep as a ``descendant`` of the launcher; nothing else
changes, so what finds it is the daemon's look between observations.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, report, require_modules
from benchmarks.rawclient import RawClient
from benchmarks.stats import percentile

from .descendants import _gone, _until

__all__ = ["run"]

FIXED_COST_TARGET_S = 0.150

#: CMD: leaves an orphaned sleep per "fork" line and prints its pid and the clock; kills
#: it on "kill" (the launcher reaps it) and prints the clock.
_ORPHANER = """
import os, signal, subprocess, sys, time
pid = None
for line in sys.stdin:
    if line.strip() == "fork":
        at = time.monotonic()
        out = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True).stdout
        pid = int(out)
        print(pid, at, flush=True)
    elif pid is not None:
        os.kill(pid, signal.SIGKILL)
        print(pid, time.monotonic(), flush=True)
"""


def _capsulectl() -> list[str]:
    return [sys.executable, "-m", "capsule_client.cli"]


def _env(home: Path, sock: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CAPSULE_HOME=str(home), CAPSULED_SOCKET=str(sock))
    return env


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def _fixed_cost(
    ctx: Context, home: Path, sock: Path
) -> tuple[list[float], list[float], list[float]]:
    """(run -- true, true, the interpreter importing capsulectl) durations in seconds,
    alternating."""
    env = _env(home, sock)
    with_run: list[float] = []
    bare: list[float] = []
    imports: list[float] = []
    for _ in range(ctx.size(quick=3, full=40)):
        with_run.append(_timed([*_capsulectl(), "run", "--session", "ses_b", "--", "true"], env))
        bare.append(_timed(["true"], env))
        imports.append(_timed([sys.executable, "-c", "import capsule_client.cli"], env))
    return with_run, bare, imports


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _waiting_rss(home: Path, sock: Path) -> int:
    """The launcher's RSS, KiB, once its CMD (``cat``, reading its stdin) runs."""
    launcher = subprocess.Popen(
        [*_capsulectl(), "run", "--session", "ses_rss", "--", "cat"],
        env=_env(home, sock),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert launcher.stdin is not None and launcher.stdout is not None
    try:
        launcher.stdin.write(b"ping\n")
        launcher.stdin.flush()
        launcher.stdout.readline()  # CMD answered: the launcher waits in its loop
        return _rss_kib(launcher.pid)
    finally:
        launcher.stdin.close()
        launcher.wait(timeout=10)
        launcher.stdout.close()


def _orphan_latency(ctx: Context, home: Path, sock: Path) -> tuple[list[float], list[float]]:
    """(orphan -> listed, killed -> gone) latencies in seconds, one per trial."""
    launcher = subprocess.Popen(
        [*_capsulectl(), "run", "--session", "ses_orphans", "--", sys.executable, "-c", _ORPHANER],
        env=_env(home, sock),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert launcher.stdin is not None and launcher.stdout is not None
    found: list[float] = []
    gone: list[float] = []

    def listed_under(pid: int) -> Any:
        def check(answer: dict[str, Any]) -> bool:
            return any(
                p["pid"] == pid and p["kind"] == "descendant" and p.get("root_pid") == launcher.pid
                for s in answer["sessions"]
                for p in s["processes"]
            )

        return check

    try:
        with RawClient(sock) as client:
            for _ in range(ctx.size(quick=2, full=40)):
                time.sleep(random.uniform(0.0, 1.0))  # another phase of the daemon's look timer
                launcher.stdin.write("fork\n")
                launcher.stdin.flush()
                pid_text, at_text = launcher.stdout.readline().split()
                pid, forked_at = int(pid_text), float(at_text)
                _, listed_at = _until(client, listed_under(pid))
                found.append(listed_at - forked_at)
                launcher.stdin.write("kill\n")
                launcher.stdin.flush()
                killed_at = float(launcher.stdout.readline().split()[1])
                _, gone_at = _until(client, _gone(pid))
                gone.append(gone_at - killed_at)
    finally:
        launcher.stdin.close()
        launcher.wait(timeout=10)
        launcher.stdout.close()
    return found, gone


def _ms(samples: list[float], p: float) -> str:
    return f"{percentile(samples, p) * 1000:.0f} ms"


def run(ctx: Context) -> Outcome:
    """The fixed cost with and without a daemon, the RSS, then the orphan trials."""
    require_modules("capsule_client.kit.launcher")
    scratch = ctx.scratch("launcher")
    home = scratch / "home"
    home.mkdir(mode=0o700)
    sock = scratch / "d.sock"
    alone, bare_alone, _ = _fixed_cost(ctx, scratch / "nohome", scratch / "none.sock")
    with DaemonProcess(home, sock, log_level="warning"):
        with_daemon, bare, imports = _fixed_cost(ctx, home, sock)
        rss = _waiting_rss(home, sock)
        found, gone = _orphan_latency(ctx, home, sock)
    cost = percentile(with_daemon, 50) - percentile(bare, 50)
    ctx.log(f"18: run -- true costs {cost * 1000:.0f} ms more than true; RSS {rss} KiB")
    verdicts = [
        judge(
            "`capsulectl run -- true` against `true`: <= 150 ms more (p50, daemon running)",
            f"{cost * 1000:.0f} ms more ({_ms(with_daemon, 50)} against {_ms(bare, 50)})",
            cost <= FIXED_COST_TARGET_S,
        ),
        report("the waiting launcher's RSS", f"{rss / 1024:.1f} MiB"),
        report(
            "orphan under the launcher found: p50 / p99 (a since long poll)",
            f"p50 {_ms(found, 50)}, p99 {_ms(found, 99)} over {len(found)} orphans",
        ),
    ]
    tables = [
        Table(
            columns=["command", "trials", "p50", "p99"],
            rows=[
                [name, str(len(s)), _ms(s, 50), _ms(s, 99)]
                for name, s in (
                    ("`true`", bare),
                    ("`python -c 'import capsule_client.cli'` (the launcher's floor)", imports),
                    ("`capsulectl run -- true`, daemon running", with_daemon),
                    ("`true` (beside the run without a daemon)", bare_alone),
                    ("`capsulectl run -- true`, no daemon", alone),
                )
            ],
        ),
        Table(
            columns=["event", "trials", "p50", "p99"],
            rows=[
                [
                    "orphan re-parented to the launcher -> listed",
                    str(len(found)),
                    _ms(found, 50),
                    _ms(found, 99),
                ],
                ["orphan killed -> gone", str(len(gone)), _ms(gone, 50), _ms(gone, 99)],
            ],
        ),
    ]
    notes = [
        "Fixed cost: wall time of subprocess.run in the benchmark, the interpreter's start "
        "and capsule_client's imports included; with a daemon the launcher also pings it, "
        "registers the session and its row in the store, and asks for one fresh look "
        "(sessions.snapshot with max_age_ms 0) when CMD exits. The interpreter starting and "
        "importing capsulectl, alternating with them, is the part no launcher work can save.",
        f"RSS: VmRSS of the launcher while its CMD runs ({rss} KiB).",
        "Orphan -> listed: from the monotonic clock read before `sh -c 'sleep 300 & echo $!'` "
        "in CMD to the `since` answer listing the sleep with root_pid the launcher; only the "
        "daemon's look between observations (every second) finds it.",
    ]
    return Outcome(tables=tables, verdicts=verdicts, notes=notes)
