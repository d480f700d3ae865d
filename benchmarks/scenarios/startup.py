"""Scenario 20: how long the commands users run often take to start (docs/design.md §9).

Each command is a whole process, started by the benchmark and waited for, as
a hook or a wrapper starts it: the installed ``capsulectl`` script beside
this interpreter, in rounds that alternate it with the baseline, a bare
``python3 -I -c pass`` (the system's python3), so both see the same load.

- ``capsulectl --version``: nothing but the version;
- ``capsulectl sessions``: a read-your-writes snapshot of a daemon serving one
  session of three processes, rendered as the table;
- ``capsulectl run -- true``: the launcher's whole run with a daemon (a new
  session, its ping, its store rows, CMD, the look at CMD's exit);
- ``capsulectl hook claude-code``, as Claude Code runs it after every ``Bash`` call:
  a ``PostToolUse`` of a foreground command on stdin, which records nothing (the
  common case), and one of a background command, which appends ``shell_detached``
  to the session's trace;
- ``capsulectl mcp``: from the spawn to the reply to an ``initialize``
  request written to its stdin (the MCP SDK's import is most of it); reported,
  not budgeted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import (
    Context,
    NotMeasured,
    Outcome,
    Table,
    Verdict,
    judge,
    report,
    require_modules,
    whole_process_s,
)
from benchmarks.homes import SleepPool
from benchmarks.stats import percentile

__all__ = ["run"]

#: The budgets, as multiples of the baseline's median (docs/design.md §9).
VERSION_BUDGET = 2.0
SESSIONS_BUDGET = 5.0
RUN_BUDGET = 6.0
HOOK_QUIET_BUDGET = 3.0
HOOK_RECORD_BUDGET = 6.0

#: ``capsulectl hook claude-code``'s input: a ``PostToolUse`` of ``Bash`` as Claude Code
#: sends it (tests/claude_code/FINDINGS.md §5), in the foreground or the background.
HOOK_SESSION = "3f1c8a52-6d0e-4b7a-9c51-2e8f0a4d7b16"


def _post_tool_use(background: bool, task: int) -> bytes:
    tool_input: dict[str, object] = {"command": "npm test", "description": "Run the tests"}
    response: dict[str, object] = {"stdout": "ok " * 300, "stderr": "", "interrupted": False}
    if background:
        tool_input["run_in_background"] = True
        response = {"stdout": "", "stderr": "", "interrupted": False,
                    "backgroundTaskId": f"bbench{task}"}  # fmt: skip
    event = {
        "session_id": HOOK_SESSION,
        "transcript_path": f"/home/u/.claude/projects/-home-u-p/{HOOK_SESSION}.jsonl",
        "cwd": "/home/u/p",
        "hook_event_name": "PostToolUse",
        "tool_name": "Bash",
        "tool_input": tool_input,
        "tool_response": response,
        "tool_use_id": f"toolu_{task}",
    }
    return json.dumps(event).encode()


#: An MCP ``initialize`` request, as a host writes it to the server's stdin.
INITIALIZE = (
    json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "benchmarks", "version": "0"},
            },
        }
    )
    + "\n"
).encode()


def _system_python3() -> str:
    """The system's python3: the first on ``PATH`` that is an interpreter itself (a shim,
    such as pyenv's, is a script that starts one), else ``/usr/bin/python3``."""
    for candidate in (shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate is None:
            continue
        try:
            with open(candidate, "rb") as file:
                if file.read(2) != b"#!":
                    return candidate
        except OSError:
            continue
    raise NotMeasured("no python3 interpreter found (only scripts, or none)")


def _capsulectl() -> str:
    script = Path(sys.executable).parent / "capsulectl"
    if not script.exists():
        raise NotMeasured(f"no capsulectl script beside {sys.executable}: install the checkout")
    return str(script)


def _timed(argv: list[str], env: dict[str, str], stdin: bytes | None = None) -> float:
    """Seconds from the spawn of ``argv`` (``stdin`` on its stdin) to its exit (which must
    be 0)."""
    return whole_process_s(argv, env=env, stdin=stdin)


def _to_initialize_reply(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from the spawn of ``capsulectl mcp`` to the reply to ``initialize``."""
    started = time.perf_counter()
    server = subprocess.Popen(
        argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        server.stdin.write(INITIALIZE)
        server.stdin.flush()
        reply = server.stdout.readline()
        elapsed = time.perf_counter() - started
        if b'"id":1' not in reply.replace(b" ", b"") or b'"result"' not in reply:
            raise RuntimeError(f"capsulectl mcp answered initialize with {reply[:300]!r}")
    finally:
        server.stdin.close()
        server.wait(timeout=30)
        server.stdout.close()
    return elapsed


def _own(home: Path, pids: list[int]) -> None:
    """One session, ``ses_start``, owning every pid by its (pid, start) row."""
    from capsule_client.kit.paths import store_path
    from capsule_client.kit.store import OwnershipStore

    with OwnershipStore(store_path(home)) as store:
        store.register_session("ses_start", title="start-up")
        for pid in pids:
            store.register_process(pid, "ses_start")


def _ms(samples: list[float]) -> str:
    return f"{percentile(samples, 50) * 1000:.1f} ms"


def _rounds(count: int, commands: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each command once per round, in the same order every round."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(count):
        for name, measure in commands.items():
            samples[name].append(measure())
    return samples


def run(ctx: Context) -> Outcome:
    """The rounds against a running daemon, then the MCP server's starts."""
    require_modules("capsule_client.cli.main")
    python3 = _system_python3()
    capsulectl = _capsulectl()
    rounds = ctx.size(quick=10, full=40)
    starts = ctx.size(quick=2, full=10)
    scratch = ctx.scratch("startup")
    home = scratch / "home"
    home.mkdir(mode=0o700)
    pool = SleepPool(3, exited=False)
    try:
        _own(home, pool.pids)
        with DaemonProcess(home, scratch / "d.sock", log_level="warning") as daemon:
            # As a user's shell runs them: bytecode is cached (a first run writes it).
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env.update(CAPSULE_HOME=str(home), CAPSULED_SOCKET=str(daemon.socket_path))
            _timed([capsulectl, "sessions"], env)  # the session is listed before timing
            _timed([capsulectl, "--version"], env)
            _timed([capsulectl, "run", "--", "true"], env)
            hook = [capsulectl, "hook", "claude-code"]
            tasks = iter(range(1_000_000))
            _timed(hook, env, _post_tool_use(False, 0))
            _timed(hook, env, _post_tool_use(True, next(tasks)))
            samples = _rounds(
                rounds,
                {
                    "baseline": lambda: _timed([python3, "-I", "-c", "pass"], env),
                    "interpreter": lambda: _timed([sys.executable, "-I", "-c", "pass"], env),
                    "--version": lambda: _timed([capsulectl, "--version"], env),
                    "sessions": lambda: _timed([capsulectl, "sessions"], env),
                    "run": lambda: _timed([capsulectl, "run", "--", "true"], env),
                    "hook quiet": lambda: _timed(hook, env, _post_tool_use(False, 0)),
                    "hook records": lambda: _timed(hook, env, _post_tool_use(True, next(tasks))),
                },
            )
            mcp = _mcp_starts(capsulectl, env, starts)
    finally:
        pool.close()
    base = percentile(samples["baseline"], 50)

    def ratio(name: str) -> float:
        return percentile(samples[name], 50) / base

    def measured(name: str) -> str:
        return f"{_ms(samples[name])}, {ratio(name):.1f}x the baseline ({_ms(samples['baseline'])})"

    ctx.log(
        f"20: --version {ratio('--version'):.1f}x, sessions {ratio('sessions'):.1f}x, "
        f"run -- true {ratio('run'):.1f}x, hook {ratio('hook quiet'):.1f}x / "
        f"{ratio('hook records'):.1f}x python3 -I -c pass"
    )
    verdicts = [
        judge(
            f"capsulectl --version <= {VERSION_BUDGET:g}x python3 -I -c pass",
            measured("--version"),
            ratio("--version") <= VERSION_BUDGET,
        ),
        judge(
            f"capsulectl sessions <= {SESSIONS_BUDGET:g}x python3 -I -c pass",
            measured("sessions"),
            ratio("sessions") <= SESSIONS_BUDGET,
        ),
        judge(
            f"capsulectl run -- true <= {RUN_BUDGET:g}x python3 -I -c pass",
            measured("run"),
            ratio("run") <= RUN_BUDGET,
        ),
        judge(
            f"capsulectl hook claude-code recording nothing <= {HOOK_QUIET_BUDGET:g}x "
            "python3 -I -c pass",
            measured("hook quiet"),
            ratio("hook quiet") <= HOOK_QUIET_BUDGET,
        ),
        judge(
            f"capsulectl hook claude-code recording <= {HOOK_RECORD_BUDGET:g}x python3 -I -c pass",
            measured("hook records"),
            ratio("hook records") <= HOOK_RECORD_BUDGET,
        ),
        _mcp_verdict(mcp, base),
    ]
    rows = [
        [label, str(len(samples[name])), _ms(samples[name]), f"{ratio(name):.2f}x"]
        for name, label in (
            ("baseline", f"baseline: `{python3} -I -c pass`"),
            ("interpreter", "capsulectl's interpreter: `python -I -c pass`"),
            ("--version", "`capsulectl --version`"),
            ("sessions", "`capsulectl sessions`, one session of 3 processes"),
            ("run", "`capsulectl run -- true`, daemon running"),
            ("hook quiet", "`capsulectl hook claude-code`: a foreground Bash, nothing recorded"),
            ("hook records", "`capsulectl hook claude-code`: a background Bash, recorded"),
        )
    ]
    if mcp:
        rows.append(
            [
                "`capsulectl mcp`: spawn to the `initialize` reply",
                str(len(mcp)),
                _ms(mcp),
                f"{percentile(mcp, 50) / base:.2f}x",
            ]
        )
    notes = [
        "Whole processes, spawned by the benchmark and waited for with a blocking waitpid "
        "(heard at once: a wait with a timeout polls, and hears an exit up to tens of ms "
        "late), "
        f"alternating in {rounds} rounds; the medians are compared with the baseline's "
        f"median of the same rounds. The baseline is the system's python3 ({python3}); "
        f"capsulectl runs on {sys.executable} (its own bare start is the second row), "
        "with its bytecode cached, as for a user (a first run of each command writes it; "
        "PYTHONDONTWRITEBYTECODE is not passed on).",
        "`sessions` asks a fresh snapshot with the command lines and prints the table; "
        "`run` makes a new session, registers it and its row in the store, pings the "
        "daemon, runs `true` and asks for one fresh look at its exit.",
        "`hook` reads a `PostToolUse` of `Bash` on stdin (a 1 KB output for the foreground "
        "command): the foreground one is decided with `json` alone and records nothing; "
        "the background one is decoded with msgspec and appends `shell_detached` to the "
        "session's trace under its lock (the trace grows by a line a run).",
        "`mcp`: the spawn, the import of the MCP SDK, and the reply to an `initialize` "
        f"request written to its stdin, {starts} starts; reported, not budgeted (an agent "
        "host starts it once per session).",
    ]
    return Outcome(
        tables=[Table(columns=["command", "runs", "median", "ratio"], rows=rows)],
        verdicts=verdicts,
        notes=notes,
    )


def _mcp_starts(capsulectl: str, env: dict[str, str], starts: int) -> list[float]:
    """Spawn-to-``initialize``-reply seconds of ``starts`` servers (none without the SDK)."""
    try:
        require_modules("mcp")
    except NotMeasured:
        return []
    return [_to_initialize_reply([capsulectl, "mcp"], env) for _ in range(starts)]


def _mcp_verdict(samples: list[float], base: float) -> Verdict:
    target = "capsulectl mcp: spawn to the initialize reply"
    if not samples:
        return Verdict(target, "the extra capsuled[mcp] is not installed", "not measured")
    return report(
        target,
        f"{_ms(samples)} ({percentile(samples, 50) / base:.0f}x the baseline), "
        f"max {max(samples) * 1000:.0f} ms over {len(samples)} starts",
    )
