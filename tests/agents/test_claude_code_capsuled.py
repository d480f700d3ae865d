"""Claude Code, unchanged, as a capsuled session through its own hooks (docs/design.md §11,
§12; docs/claude-code.md), against the real binary.

Each test is one offline Claude Code user (``claude`` fixture: its own HOME, the
Messages API stand-in as the model), a real daemon on its own home and socket, and
capsuled's hooks and MCP server installed the way a user installs them: by running
``capsulectl integrate claude-code`` (the venv's console script) into that HOME. Claude
Code gets the daemon's home and socket in its environment, as a user's shell would
give them, and passes them on to its hooks and MCP servers. The two scenarios that
run Claude Code several times are marked ``slow`` (``make test-slow``).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.claude_code import ClaudeCode, needs_claude, process, wait_for
from helpers.daemon import DaemonProcess
from helpers.messages_api import Request, Text, ToolUse, result_text

from capsule_client import Client
from capsule_client.wire import Session

pytestmark = needs_claude

CAPSULECTL = str(Path(sys.executable).with_name("capsulectl"))


class Capsuled:
    """The daemon a Claude Code user's hooks talk to, and what they left."""

    def __init__(self, claude: ClaudeCode, daemon: DaemonProcess, log: Path) -> None:
        self.claude = claude
        self.daemon = daemon
        self.log = log

    @property
    def env(self) -> dict[str, str]:
        """What Claude Code gets beside its own environment (and passes to its hooks)."""
        return {
            "CAPSULE_HOME": str(self.daemon.home),
            "CAPSULED_SOCKET": str(self.daemon.socket_path),
            "CAPSULE_HOOK_LOG": str(self.log),
        }

    def integrate(self, *args: str, cwd: Path | None = None) -> str:
        """``capsulectl integrate claude-code ARGS`` as this user, in the project."""
        done = subprocess.run(
            [CAPSULECTL, "integrate", "claude-code", *args],
            env={**self.claude.env(), **self.env},
            cwd=cwd or self.claude.project,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def session(self, claude_session_id: str) -> Session | None:
        """Claude Code's session in a fresh snapshot, None when it is not active."""
        with Client(self.daemon.socket_path, timeout_s=30) as client:
            snapshot = client.snapshot(fresh=True, commands=True)
        wanted = f"ses_claude_{claude_session_id}"
        return next((s for s in snapshot.sessions if s.session_id == wanted), None)

    def trace(self, claude_session_id: str) -> list[dict[str, Any]]:
        path = self.daemon.home / "sessions" / f"ses_claude_{claude_session_id}" / "trace.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def hook_runs(self) -> list[dict[str, Any]]:
        """What each hook run logged (CAPSULE_HOOK_LOG): one entry per run that finished."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def capsuled(claude: ClaudeCode, daemon: DaemonProcess, tmp_path: Path) -> Iterator[Capsuled]:
    yield Capsuled(claude, daemon, tmp_path / "hooks.log")


def background(command: str) -> ToolUse:
    return ToolUse(
        "Bash", {"command": command, "description": "In the background", "run_in_background": True}
    )


def session_of(request: Request) -> str:
    return request.headers["x-claude-code-session-id"]


def task_of(request: Request) -> str:
    """The background task the conversation started (from its tool_result)."""
    match = re.search(r"running in background with ID: (\w+)", request.text())
    assert match, "no background task in the conversation"
    return match.group(1)


def listed_with(capsuled: Capsuled, session_id: str, argv: list[str]) -> Session:
    """Wait until the session lists a process whose argv is ``argv``; the session."""
    return wait_for(
        lambda: (
            (s := capsuled.session(session_id)) is not None
            and any(p.command == argv for p in s.processes)
            and s
        ),
        timeout_s=20.0,
        interval_s=0.1,
        message=f"{argv} listed in {session_id}",
    )


def lost_lines(trace: list[dict[str, Any]], work_id: str) -> list[dict[str, Any]]:
    return [e for e in trace if e["event_type"] == "shell_lost" and e["work_id"] == work_id]


@pytest.mark.slow  # three runs of Claude Code: about 15 s
def test_a_background_command_outlives_a_killed_claude_and_a_resume_is_told_it_still_runs(
    claude: ClaudeCode, capsuled: Capsuled
) -> None:
    out = capsuled.integrate()
    assert "added capsuled's hook for SessionStart" in out
    command = "sleep 63.5 && echo 'it is done'"  # quotes, as Claude Code quotes them again
    claude.api.extend([background(command), Text("started")])
    started = claude.start("start it", allowed_tools=["Bash"], env=capsuled.env)
    first, second = claude.api.wait_for_turns(2, timeout_s=30)
    session_id, task = session_of(first), task_of(second)

    # Listed under Claude Code's session, Claude Code its root.
    session = listed_with(capsuled, session_id, ["sleep", "63.5"])
    processes = {p.pid: p for p in session.processes}
    assert processes[started.pid].kind == "process"
    [sleep] = [p for p in session.processes if p.command == ["sleep", "63.5"]]
    assert sleep.kind == "descendant" and sleep.root_pid == started.pid
    detached = [e for e in capsuled.trace(session_id) if e["event_type"] == "shell_detached"]
    assert [(e["work_id"], e["binary"], e["command"]) for e in detached] == [
        (task, "/bin/bash", command)
    ]
    assert detached[0]["task_id"] == next(
        e["task_id"] for e in capsuled.trace(session_id) if e["event_type"] == "task_start"
    )

    # SIGKILL: no SessionEnd, the command runs on, still listed in the session.
    started.signal(signal.SIGKILL)
    assert started.finish().returncode == -signal.SIGKILL
    assert process(sleep.pid) is not None
    assert sleep.pid in {
        p.pid for p in listed_with(capsuled, session_id, ["sleep", "63.5"]).processes
    }

    # The resume's first request tells the model it is lost, and that it still runs.
    claude.api.extend([Text("resumed")])
    resumed = claude.run("and now?", resume=session_id, env=capsuled.env)

    assert resumed.returncode == 0, resumed.stderr
    told = resumed.turns[0].text()
    assert f"- {task} is STILL RUNNING, as pid " in told
    assert f"pid {sleep.pid} (sleep 63.5, running for" in told
    assert f"command {json.dumps(command)}" in told and "trust: trusted" in told
    assert "/bin/bash -c …, the shell it runs in, running for" in told
    assert len(lost_lines(capsuled.trace(session_id), task)) == 1

    # A second resume adds nothing, and tells nothing.
    claude.api.extend([Text("again")])
    again = claude.run("still there?", resume=session_id, env=capsuled.env)

    assert again.returncode == 0, again.stderr
    heading = "capsuled: this session's previous Claude Code process"
    assert again.turns[0].text().count(heading) == 1  # the first resume's, in the history
    assert len(lost_lines(capsuled.trace(session_id), task)) == 1
    last_start = [run for run in capsuled.hook_runs() if run["event"] == "SessionStart"][-1]
    assert "reconciled: nothing lost" in last_start["did"] and not last_start["answered"]
    assert all(run["problems"] == [] for run in capsuled.hook_runs())


@pytest.mark.slow  # two runs, the first waiting for its background command: about 10 s
def test_a_command_that_finished_before_the_session_ended_is_not_reported(
    claude: ClaudeCode, capsuled: Capsuled
) -> None:
    capsuled.integrate()
    claude.api.extend([background("sleep 2.5"), Text("started")])  # ends after the first Stop

    first = claude.run("go", allowed_tools=["Bash"], env=capsuled.env)  # -p waits for it

    assert first.returncode == 0, first.stderr
    session_id, task = session_of(first.turns[0]), task_of(first.turns[1])
    ends = [e for e in capsuled.trace(session_id) if e.get("work_id") == task]
    assert [e["event_type"] for e in ends] == ["shell_detached", "shell_completed"]
    assert (ends[1]["status"], ends[1]["exit_code"]) == ("completed", 0)  # from its notification

    claude.api.extend([Text("resumed")])
    resumed = claude.run("and now?", resume=session_id, env=capsuled.env)

    assert resumed.returncode == 0, resumed.stderr
    assert "capsuled: this session's previous" not in resumed.turns[0].text()
    assert lost_lines(capsuled.trace(session_id), task) == []


def test_the_model_stops_what_it_left_through_mcp_and_claude_code_is_spared(
    claude: ClaudeCode, capsuled: Capsuled
) -> None:
    out = capsuled.integrate("--allow-terminate")
    assert "registered the MCP server capsuled" in out
    tools = ["mcp__capsuled__session_processes", "mcp__capsuled__terminate_session"]

    def look_when_listed(request: Request) -> ToolUse:
        listed_with(capsuled, session_of(request), ["sleep", "64.5"])  # the daemon has seen it
        return ToolUse(tools[0], id="toolu_look")

    claude.api.extend(
        [
            background("sleep 64.5"),
            look_when_listed,
            ToolUse(tools[1], {"grace_ms": 3000}, id="toolu_stop"),
            Text("Stopped what I left running."),
        ]
    )

    run = claude.run("clean up", allowed_tools=["Bash", *tools], env=capsuled.env, timeout_s=60)

    assert run.returncode == 0, run.stderr
    assert run.turns[3].reply == (Text("Stopped what I left running."),)  # as scripted
    # Each tool's result reached the next request: Claude Code shows the model a tool's
    # structured content (the JSON of its output schema).
    listed = json.loads(result_text(run.turns[2].tool_result("toolu_look")))
    stopped = json.loads(result_text(run.turns[3].tool_result("toolu_stop")))
    assert listed["session_id"] == f"ses_claude_{session_of(run.turns[0])}" and listed["yours"]
    agent = {p["pid"] for p in listed["processes"] if p["this_agent"]}
    [server] = [p for p in listed["processes"] if p["command"].endswith(" mcp --allow-terminate")]
    assert agent == {run.pid, server["pid"]}
    [sleep] = [p for p in listed["processes"] if p["command"] == "sleep 64.5"]
    outcomes = {p["pid"]: p["outcome"] for p in stopped["processes"]}
    assert outcomes[run.pid] == outcomes[server["pid"]] == "spared"
    assert outcomes[sleep["pid"]] == "exited"
    assert {o for pid, o in outcomes.items() if pid not in agent} == {"exited"}
    wait_for(lambda: process(sleep["pid"]) is None, message="the sleep gone")
    assert not [p for p in claude.leftovers() if p["argv"] == ["sleep", "64.5"]]


def test_without_a_daemon_claude_code_answers_as_usual_and_every_hook_exits_0(
    claude: ClaudeCode, capsuled: Capsuled, tmp_path: Path
) -> None:
    capsuled.integrate()
    env = {**capsuled.env, "CAPSULED_SOCKET": str(tmp_path / "nobody.sock")}
    # Its end comes back as a notification, before or after the turn's end: either way
    # the model's next answer is the same.
    claude.api.extend([background("sleep 0.3"), Text("as usual"), Text("as usual")])

    run = claude.run("go", allowed_tools=["Bash"], env=env, args=["--output-format", "json"])

    assert run.returncode == 0, run.stderr
    assert run.result()["result"] == "as usual" and "hook" not in run.stderr.lower()
    runs = capsuled.hook_runs()  # one line per run, written as it returns 0
    events = sorted({entry["event"] for entry in runs})
    assert events == ["PostToolUse", "SessionStart", "Stop", "UserPromptSubmit"]
    assert all(entry["problems"] == [] for entry in runs)  # the store and traces need none
    session_id = run.result()["session_id"]
    assert [e["event_type"] for e in capsuled.trace(session_id)] == [
        "session_start",
        "task_start",
        "shell_detached",
        "shell_completed",
    ]


def test_local_scope_from_a_subdirectory_of_a_repository_reaches_claude_code_started_there(
    claude: ClaudeCode, capsuled: Capsuled
) -> None:
    subprocess.run(["git", "init", "-q", str(claude.project)], check=True, timeout=60)
    sub = claude.project / "app"
    sub.mkdir()
    capsuled.integrate("--scope", "local", cwd=sub)
    assert (claude.project / ".claude" / "settings.local.json").is_file()
    claude.api.extend([ToolUse("mcp__capsuled__session_processes", id="toolu_look"), Text("ok")])

    run = claude.run(
        "what runs?", cwd=sub, allowed_tools=["mcp__capsuled__session_processes"], env=capsuled.env
    )

    assert run.returncode == 0, run.stderr
    session_id = session_of(run.turns[0])
    assert [e["event_type"] for e in capsuled.trace(session_id)][:2] == [
        "session_start",
        "task_start",
    ]
    answer = json.loads(result_text(run.turns[1].tool_result("toolu_look")))
    assert answer["session_id"] == f"ses_claude_{session_id}" and answer["yours"] is True
    assert {p["pid"] for p in answer["processes"] if p["this_agent"]} >= {run.pid}
