"""Claude Code under ``capsulectl run`` (docs/design.md §10), against the real binary: an
agent nobody integrated, contained by the launcher. Its own process tree is listed
under the launcher's session while it runs, and what it left behind — a command a
foreground ``Bash`` sent to the background with ``&``, which outlives ``claude -p`` —
is named in the launcher's report at its exit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.claude_code import ClaudeCode, needs_claude, process, wait_for
from helpers.daemon import DaemonProcess
from helpers.messages_api import Request, Text, ToolUse

from capsule_client import Client
from capsule_client.wire import SessionProcess

pytestmark = needs_claude

CAPSULECTL = str(Path(sys.executable).with_name("capsulectl"))
SESSION = "ses_run_claude"
#: What the model leaves running: a sleep Claude Code's Bash tool does not refuse.
LEFT = f"{sys.executable} -c 'import time; time.sleep(65.5)'"


def session_processes(daemon: DaemonProcess) -> list[SessionProcess]:
    with Client(daemon.socket_path, timeout_s=30) as client:
        snapshot = client.snapshot(fresh=True, commands=True)
    return next((list(s.processes) for s in snapshot.sessions if s.session_id == SESSION), [])


def test_claude_code_under_capsulectl_run_is_listed_in_its_session_and_its_leftover_reported(
    claude: ClaudeCode, daemon: DaemonProcess
) -> None:
    seen: list[SessionProcess] = []

    def when_listed(request: Request) -> Text:
        """The model's last turn, once the daemon lists Claude Code and what it left."""

        def listed() -> bool:
            seen[:] = session_processes(daemon)
            commands = [" ".join(p.command or []) for p in seen]
            return any(c.startswith(str(claude.binary)) for c in commands) and any(
                "time.sleep(65.5)" in c for c in commands
            )

        wait_for(listed, timeout_s=20.0, interval_s=0.1, message="claude and its leftover listed")
        return Text("done")

    claude.api.extend(
        [ToolUse("Bash", {"command": f"{LEFT} >/dev/null 2>&1 & echo launched"}), when_listed]
    )
    env = claude.env(CAPSULE_HOME=str(daemon.home), CAPSULED_SOCKET=str(daemon.socket_path))
    launcher = subprocess.run(
        [
            CAPSULECTL,
            "run",
            "--session",
            SESSION,
            "--",
            *claude.command("go", allowed_tools=["Bash"]),
        ],
        env=env,
        cwd=claude.project,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )

    assert launcher.returncode == 0, launcher.stderr  # Claude Code's own status
    assert launcher.stdout.strip() == "done"
    # While it ran: Claude Code under the launcher, a descendant of the session's root.
    roots = [p for p in seen if p.kind == "process"]
    [agent] = [p for p in seen if " ".join(p.command or []).startswith(str(claude.binary))]
    assert len(roots) == 1 and agent.kind == "descendant" and agent.root_pid == roots[0].pid
    [left] = [p for p in seen if "time.sleep(65.5)" in " ".join(p.command or [])]
    # At its exit: the leftover still runs, and the report names it and what stops it.
    assert process(left.pid) is not None
    assert f"{left.pid}" in launcher.stderr and "time.sleep(65.5)" in launcher.stderr
    assert f"capsulectl terminate {SESSION}" in launcher.stderr
