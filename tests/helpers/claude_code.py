"""The real Claude Code, run offline against the Messages API stand-in.

``make test-tools`` installs the pinned ``@anthropic-ai/claude-code`` into
tests/claude_code/node_modules (npm ci); the native binary is in the optional
package ``@anthropic-ai/claude-code-linux-x64``. Where it is absent, the tests
that need it skip and say why (:data:`needs_claude`, :func:`require_claude`).
``CAPSULED_TEST_CLAUDE=/path/to/claude`` runs them with another binary.

Each :class:`ClaudeCode` is one user: its own ``HOME`` (Claude Code keeps
``~/.claude/`` and ``~/.claude.json`` there) and working directory under the
test's tmp_path, and an environment built from nothing but what it needs, so
that it stays offline and quiet and no variable of the shell that runs the
suite (an outer Claude Code's, say) leaks in. Every process it starts carries
a marker variable; :meth:`ClaudeCode.close` kills whatever still carries it
(background commands outlive a killed claude).

What the binary does with its hooks, settings and MCP servers, as measured:
tests/claude_code/FINDINGS.md.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from helpers.messages_api import MessagesAPI, Request
from helpers.waits import wait_until

PINNED_DIR = Path(__file__).parents[1] / "claude_code"
RECORDER = Path(__file__).with_name("hook_recorder.py")
MCP_RECORDER = Path(__file__).with_name("mcp_recorder.py")
MARKER = "CAPSULED_TEST_CLAUDE_RUN"  # set in every run's environment, inherited by its children
DEADLINE_S = 30.0  # one `claude -p` run: about a second here, more on a loaded machine

T = TypeVar("T")


def claude_binary() -> Path | None:
    """The claude binary the tests run: ``$CAPSULED_TEST_CLAUDE``, else the pinned install.

    The pinned install's native binary is the platform package's
    (``@anthropic-ai/claude-code-linux-x64/claude`` here), run directly: the
    wrapper package's ``bin/claude.exe`` is a copy only once its postinstall ran.
    """
    override = os.environ.get("CAPSULED_TEST_CLAUDE")
    if override:
        return Path(override)
    scope = PINNED_DIR / "node_modules" / "@anthropic-ai"
    for candidate in sorted(scope.glob("claude-code-*/claude")):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


SKIP_REASON = (
    "Claude Code is not installed: `make test-tools` installs the pinned "
    "@anthropic-ai/claude-code into tests/claude_code (npm ci) where npm is present"
)
needs_claude = pytest.mark.skipif(claude_binary() is None, reason=SKIP_REASON)


def require_claude() -> Path:
    """The binary, or skip the calling test with the reason."""
    binary = claude_binary()
    if binary is None:
        pytest.skip(SKIP_REASON)
    return binary


# -- processes ---------------------------------------------------------------


def process(pid: int) -> dict[str, Any] | None:
    """pid, ppid, comm and argv of ``pid`` from /proc; ``None`` once it is gone (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    after = stat[stat.rindex(")") + 2 :].split()
    if after[0] == "Z":
        return None
    return {
        "pid": pid,
        "ppid": int(after[1]),
        "comm": stat[stat.index("(") + 1 : stat.rindex(")")],
        "argv": [part.decode(errors="replace") for part in argv if part],
    }


def ancestry(pid: int) -> list[dict[str, Any]]:
    """``pid`` and its ancestors, nearest first, up to pid 1."""
    chain = []
    while pid > 0 and (entry := process(pid)) is not None:
        chain.append(entry)
        if pid == 1:
            break
        pid = entry["ppid"]
    return chain


def processes_with(value: str, variable: str = MARKER) -> list[dict[str, Any]]:
    """The live processes whose environment has ``variable=value``."""
    needle = f"{variable}={value}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and (info := process(int(entry.name))) is not None:
            found.append(info)
    return found


def wait_for(
    predicate: Callable[[], T | bool | None],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    message: str = "condition",
) -> T:
    """:func:`helpers.waits.wait_until` with the longer deadline a Claude Code run needs."""
    return wait_until(predicate, timeout_s=timeout_s, interval_s=interval_s, message=message)


# -- hooks -------------------------------------------------------------------


def recorder_command(directory: Path, *options: str) -> str:
    """The shell command of a hook that records each call into ``directory`` (hook_recorder.py)."""
    return shlex.join([sys.executable, str(RECORDER), str(directory), *options])


def hook_settings(commands: Mapping[str, str | Sequence[str]], **entry: Any) -> dict[str, Any]:
    """A settings object with command hooks: ``{"hooks": {event: [{"hooks": [...]}]}}``.

    Args:
        commands: each event name with its command (or commands).
        entry: extra keys of each matcher entry (``matcher="Bash"``).
    """
    hooks: dict[str, Any] = {}
    for event, command in commands.items():
        listed = [command] if isinstance(command, str) else list(command)
        hooks[event] = [{**entry, "hooks": [{"type": "command", "command": one} for one in listed]}]
    return {"hooks": hooks}


@dataclass(frozen=True)
class HookCall:
    """One hook call recorded by hook_recorder.py."""

    event: dict[str, Any]
    env: dict[str, str]
    ancestry: list[dict[str, Any]]
    started_ns: int
    path: Path

    @property
    def name(self) -> str:
        return str(self.event.get("hook_event_name", ""))


def hook_calls(directory: Path, event: str | None = None) -> list[HookCall]:
    """The calls recorded in ``directory`` in the order they started (``event``'s only if given)."""
    calls = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        record = json.loads(path.read_text())
        call = HookCall(
            event=record["event"] if isinstance(record["event"], dict) else {},
            env=record["env"],
            ancestry=record["ancestry"],
            started_ns=record["started_ns"],
            path=path,
        )
        if event is None or call.name == event:
            calls.append(call)
    return sorted(calls, key=lambda call: call.started_ns)


def mcp_recorder_argv(log: Path) -> list[str]:
    """The command of a stdio MCP server that records its life into ``log`` (mcp_recorder.py)."""
    return [sys.executable, str(MCP_RECORDER), str(log)]


def mcp_log(log: Path, event: str | None = None) -> list[dict[str, Any]]:
    """What mcp_recorder.py wrote into ``log`` (``event``'s entries only if given), or []."""
    if not log.is_file():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines() if line]
    return [entry for entry in entries if event is None or entry["event"] == event]


# -- runs --------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One finished ``claude`` run.

    Attributes:
        returncode: its exit status (negative: killed by that signal).
        stdout, stderr: what it wrote.
        requests: what the stand-in received during the run (all kinds).
        duration_s: from start to exit.
    """

    pid: int
    returncode: int
    stdout: str
    stderr: str
    requests: list[Request]
    duration_s: float

    @property
    def turns(self) -> list[Request]:
        """The run's streaming message requests (the agent's loop)."""
        return [request for request in self.requests if request.turn is not None]

    def result(self) -> dict[str, Any]:
        """stdout parsed as the ``--output-format json`` result."""
        parsed: dict[str, Any] = json.loads(self.stdout)
        return parsed


class Started:
    """A ``claude`` process started without waiting (:meth:`ClaudeCode.start`)."""

    def __init__(self, popen: subprocess.Popen[str], api: MessagesAPI) -> None:
        self.popen = popen
        self.pid = popen.pid
        self._api = api
        self._first_request = len(api.requests)
        self._started = time.monotonic()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the claude process alone (not to its children)."""
        self.popen.send_signal(signum)

    def finish(self, timeout_s: float = DEADLINE_S) -> Run:
        """Wait for the exit (kill it after ``timeout_s`` and fail) and return the run."""
        try:
            stdout, stderr = self.popen.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            stdout, stderr = self.popen.communicate()
            raise AssertionError(
                f"claude did not exit within {timeout_s} s; stdout {stdout!r}, stderr {stderr!r}"
            ) from None
        return Run(
            pid=self.pid,
            returncode=self.popen.returncode,
            stdout=stdout,
            stderr=stderr,
            requests=self._api.requests[self._first_request :],
            duration_s=time.monotonic() - self._started,
        )


class ClaudeCode:
    """One offline Claude Code user under ``root``: a home, a project directory, an environment.

    Args:
        root: a fresh directory (the test's tmp_path); ``home/`` and ``project/`` go there.
        api: the Messages API stand-in, already serving.
        binary: the claude binary (:func:`require_claude`).
    """

    def __init__(self, root: Path, api: MessagesAPI, binary: Path) -> None:
        self.root = root
        self.api = api
        self.binary = binary
        self.home = root / "home"
        self.project = root / "project"
        self.hook_dir = root / "hooks"  # where recorder_command(self.hook_dir) writes
        # TMPDIR: claude puts its sockets there (cc-socks/PID.sock), so a short path.
        self.tmp = Path(tempfile.mkdtemp(prefix="cct", dir="/tmp"))
        self.marker = uuid.uuid4().hex
        self.home.mkdir(parents=True, exist_ok=True)
        self.project.mkdir(parents=True, exist_ok=True)
        self._started: list[Started] = []

    # -- environment and files -------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a run: offline, quiet, this user's HOME, plus ``extra``."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(self.home),
            "USER": os.environ.get("USER", "root"),
            "LANG": "C.UTF-8",
            "SHELL": "/bin/bash",
            "TMPDIR": str(self.tmp),
            "ANTHROPIC_BASE_URL": self.api.url,
            "ANTHROPIC_API_KEY": "sk-ant-standin",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            MARKER: self.marker,
        }
        env.update(extra)
        return env

    def settings_path(self, scope: str) -> Path:
        """Where the settings of ``scope`` live: ``user``, ``project`` or ``local``."""
        paths = {
            "user": self.home / ".claude" / "settings.json",
            "project": self.project / ".claude" / "settings.json",
            "local": self.project / ".claude" / "settings.local.json",
        }
        return paths[scope]

    def write_json(self, path: Path, data: Mapping[str, Any]) -> Path:
        """Write ``data`` as JSON at ``path`` (its directory made); return the path."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2))
        return path

    def hook_calls(self, event: str | None = None) -> list[HookCall]:
        """What the recorder hooks of this user recorded (:func:`hook_calls`)."""
        return hook_calls(self.hook_dir, event)

    # -- runs --------------------------------------------------------------------

    def command(
        self,
        prompt: str | None,
        *,
        resume: str | None = None,
        settings: Path | None = None,
        allowed_tools: Iterable[str] = (),
        args: Sequence[str] = (),
    ) -> list[str]:
        """The argv of a ``claude -p`` run (``prompt`` None: bare ``claude ARGS``)."""
        argv = [str(self.binary)]
        if prompt is not None:
            argv += ["-p", prompt]
        if resume is not None:
            argv += ["--resume", resume]
        if settings is not None:
            argv += ["--settings", str(settings)]
        tools = list(allowed_tools)
        if tools:
            argv += ["--allowedTools", ",".join(tools)]
        return argv + list(args)

    def start(
        self,
        prompt: str | None,
        *,
        resume: str | None = None,
        settings: Path | None = None,
        allowed_tools: Iterable[str] = (),
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Started:
        """Start ``claude -p prompt`` without waiting; its stdin is /dev/null."""
        popen = subprocess.Popen(
            self.command(
                prompt, resume=resume, settings=settings, allowed_tools=allowed_tools, args=args
            ),
            cwd=cwd or self.project,
            env=self.env(**(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started = Started(popen, self.api)
        self._started.append(started)
        return started

    def run(
        self,
        prompt: str | None,
        *,
        resume: str | None = None,
        settings: Path | None = None,
        allowed_tools: Iterable[str] = (),
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout_s: float = DEADLINE_S,
    ) -> Run:
        """Run ``claude -p prompt`` to its exit (killed and failed after ``timeout_s``)."""
        started = self.start(
            prompt,
            resume=resume,
            settings=settings,
            allowed_tools=allowed_tools,
            args=args,
            env=env,
            cwd=cwd,
        )
        return started.finish(timeout_s)

    def cli(self, *args: str, timeout_s: float = DEADLINE_S) -> subprocess.CompletedProcess[str]:
        """Run ``claude ARGS`` (``mcp add ...``, say) in the project, as this user; wait for it."""
        return subprocess.run(
            [str(self.binary), *args],
            cwd=self.project,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def leftovers(self) -> list[dict[str, Any]]:
        """The live processes of this user's runs (the marker in their environment)."""
        return processes_with(self.marker)

    def close(self) -> None:
        """Kill every process this user's runs left (claude itself, background commands)."""
        for started in self._started:
            if started.popen.poll() is None:
                started.popen.kill()
                started.popen.communicate()
        for _ in range(10):
            left = self.leftovers()
            if not left:
                break
            for info in left:
                try:
                    os.kill(info["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        shutil.rmtree(self.tmp, ignore_errors=True)
