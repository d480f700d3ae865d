"""The rest of tests/claude_code/FINDINGS.md, each fact re-measured with the real binary.

tests/agents/test_claude_code_harness.py holds the facts the integration is
built on and runs with every ``make test``; this module holds the rest of
the characterization: how hooks fail, time out and block, what survives
which exit, which settings and MCP files are read from where. It runs the
real binary some thirty times (two to six seconds each on two cores), so it
is marked ``slow``: ``make test-slow`` runs it, and it is what to run when
the pin in tests/claude_code changes.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers.claude_code import (
    DEADLINE_S,
    ClaudeCode,
    hook_calls,
    hook_settings,
    mcp_log,
    mcp_recorder_argv,
    needs_claude,
    process,
    recorder_command,
    wait_for,
)
from helpers.messages_api import Request, Text, ToolUse, result_text

pytestmark = [needs_claude, pytest.mark.slow]

EVENTS = ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "SessionEnd"]


def background(
    command: str, description: str = "Run in the background", **extra: object
) -> ToolUse:
    return ToolUse(
        "Bash",
        {"command": command, "description": description, "run_in_background": True, **extra},
    )


def foreground(command: str, description: str = "Run a command") -> ToolUse:
    return ToolUse("Bash", {"command": command, "description": description})


def settings_with(claude: ClaudeCode, name: str, hooks: dict[str, list[str]]) -> Path:
    """A --settings file: each event's hook is the recorder with those options."""
    commands = {
        event: recorder_command(claude.hook_dir, *options) for event, options in hooks.items()
    }
    return claude.write_json(claude.root / f"{name}.json", hook_settings(commands))


def python_sleep(seconds: float) -> str:
    """A sleeping command Claude Code's Bash tool does not refuse (it refuses a bare `sleep N`
    chained with other commands in the foreground)."""
    return f"{sys.executable} -c 'import time; time.sleep({seconds})'"


def held(release: threading.Event, then: Text) -> object:
    def turn(request: Request) -> Text:
        release.wait(DEADLINE_S)
        return then

    return turn


# -- hooks -------------------------------------------------------------------


def test_a_hook_that_exits_1_changes_nothing_for_the_agent(claude: ClaudeCode) -> None:
    claude.api.extend([foreground("echo ran > ran.txt"), Text("finished")])
    failing = {event: ["--exit", "1", "--stderr", f"FAILED-{event}"] for event in EVENTS}

    run = claude.run(
        "go", settings=settings_with(claude, "failing", failing), allowed_tools=["Bash"]
    )

    assert run.returncode == 0 and run.stdout.strip() == "finished"
    assert (claude.project / "ran.txt").read_text() == "ran\n"
    assert [call.name for call in claude.hook_calls()] == EVENTS
    assert not any("FAILED-" in json.dumps(turn.body) for turn in run.turns)
    # Only SessionEnd's failure is said, on claude's own stderr.
    assert "SessionEnd hook" in run.stderr and "FAILED-Stop" not in run.stderr


@pytest.mark.parametrize("event", EVENTS)
def test_what_exit_2_from_a_hook_does(claude: ClaudeCode, event: str) -> None:
    claude.api.extend([foreground("echo ran >> ran.txt"), Text("finished")])
    hooks = {
        one: (["--exit", "2", "--stderr", "BLOCKED"] if one == event else []) for one in EVENTS
    }

    run = claude.run(
        "go", settings=settings_with(claude, "blocking", hooks), allowed_tools=["Bash"]
    )

    assert run.returncode == 0, run.stderr
    ran = (claude.project / "ran.txt").is_file()
    told = [turn.turn for turn in run.turns if "BLOCKED" in json.dumps(turn.body)]
    stops = len(claude.hook_calls("Stop"))
    if event == "UserPromptSubmit":  # the prompt never reaches the model
        assert (len(run.turns), ran) == (0, False)
        assert "UserPromptSubmit operation blocked by hook" in run.stdout
    elif event == "PreToolUse":  # the tool does not run; stderr is its error result
        assert not ran and told == [1]
        [result] = run.turns[1].tool_results()
        assert result["is_error"] is True and "BLOCKED" in result_text(result)
    elif event == "PostToolUse":  # the tool ran; stderr reaches the model
        assert ran and told == [1]
    elif event == "Stop":  # the agent goes on, up to a cap of 8 blocks
        assert ran and stops == 9 and len(run.turns) == 10
    else:  # SessionStart, SessionEnd: nothing changes for the agent
        assert ran and told == [] and stops == 1 and len(run.turns) == 2


def test_plain_stdout_of_session_start_and_prompt_hooks_reaches_the_model(
    claude: ClaudeCode,
) -> None:
    claude.api.extend([foreground("true"), Text("finished")])
    hooks = {event: ["--print", f"PLAIN-{event}"] for event in EVENTS[:-1]}

    run = claude.run("go", settings=settings_with(claude, "plain", hooks), allowed_tools=["Bash"])

    reached = {event for event in hooks if f"PLAIN-{event}" in run.turns[-1].text()}
    assert reached == {"SessionStart", "UserPromptSubmit"}


def test_a_hook_past_its_timeout_is_killed_and_its_answer_dropped(claude: ClaudeCode) -> None:
    answer = {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "LATE"}}
    command = recorder_command(claude.hook_dir, "--sleep", "8", "--print", json.dumps(answer))
    settings = {
        "hooks": {
            "SessionStart": [{"hooks": [{"type": "command", "command": command, "timeout": 1}]}]
        }
    }
    claude.api.extend([Text("ok")])

    run = claude.run("go", settings=claude.write_json(claude.root / "timeout.json", settings))

    assert run.returncode == 0 and run.duration_s < 6
    [call] = claude.hook_calls("SessionStart")
    assert process(call.ancestry[0]["pid"]) is None
    assert "LATE" not in run.turns[0].text()


@pytest.mark.parametrize("source", ["startup", "resume"])
def test_a_slow_session_start_hook_is_waited_for(claude: ClaudeCode, source: str) -> None:
    answer = {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "SLOW"}}
    slow = settings_with(
        claude, "slow", {"SessionStart": ["--sleep", "3", "--print", json.dumps(answer)]}
    )
    claude.api.extend([Text("one"), Text("two")])
    resume = None
    if source == "resume":
        resume = claude.run("one", args=["--output-format", "json"]).result()["session_id"]

    run = claude.run("go", settings=slow, resume=resume)

    [call] = claude.hook_calls("SessionStart")
    assert call.event["source"] == source
    assert "SLOW" in run.turns[0].text()  # the request waited for the hook's 3 s
    assert run.duration_s > 3


def test_a_slow_session_end_hook_is_cancelled(claude: ClaudeCode) -> None:
    claude.api.extend([Text("ok")])

    run = claude.run("go", settings=settings_with(claude, "end", {"SessionEnd": ["--sleep", "20"]}))

    [end] = claude.hook_calls("SessionEnd")
    assert run.duration_s < 10  # not the hook's 20 s
    assert process(end.ancestry[0]["pid"]) is None
    assert "Hook cancelled" in run.stderr


def test_a_failed_foreground_bash_fires_post_tool_use_failure(claude: ClaudeCode) -> None:
    claude.api.extend([foreground("echo out; echo err >&2"), foreground("exit 4"), Text("done")])
    hooks = {event: [] for event in ("PostToolUse", "PostToolUseFailure")}

    claude.run("go", settings=settings_with(claude, "tools", hooks), allowed_tools=["Bash"])

    [ok] = claude.hook_calls("PostToolUse")
    assert "backgroundTaskId" not in ok.event["tool_response"]
    assert ok.event["tool_response"]["stdout"] == "out\nerr"  # stderr merged into stdout
    [failed] = claude.hook_calls("PostToolUseFailure")
    assert failed.event["tool_input"]["command"] == "exit 4"
    assert failed.event["error"] == "Exit code 4"


def test_fork_session_starts_a_new_session_with_source_fork(claude: ClaudeCode) -> None:
    claude.api.extend([Text("one"), Text("two")])
    settings = settings_with(claude, "start", {"SessionStart": []})
    json_out = ["--output-format", "json"]

    first = claude.run("one", settings=settings, args=json_out).result()["session_id"]
    fork = claude.run("two", settings=settings, resume=first, args=["--fork-session", *json_out])

    forked = fork.result()["session_id"]
    assert forked != first
    assert [c.event["source"] for c in claude.hook_calls("SessionStart")] == ["startup", "fork"]
    assert claude.hook_calls("SessionStart")[1].event["session_id"] == forked


# -- background work -----------------------------------------------------------


def test_print_mode_waits_for_a_running_background_task(claude: ClaudeCode) -> None:
    claude.api.extend([background("sleep 12.5"), Text("started")])

    run = claude.run("go", allowed_tools=["Bash"], timeout_s=50)

    assert run.returncode == 0 and run.duration_s > 12
    assert "<status>completed</status>" in run.turns[2].text()


def test_a_background_time_limit_kills_the_task_and_says_so(claude: ClaudeCode) -> None:
    claude.api.extend([background("sleep 30.75", "Sleep", timeout=2000), Text("started")])

    run = claude.run(
        "go", settings=settings_with(claude, "p", {"UserPromptSubmit": []}), allowed_tools=["Bash"]
    )

    assert run.duration_s < 15
    notification = claude.hook_calls("UserPromptSubmit")[1].event["prompt"]
    assert "<status>killed</status>" in notification
    assert "stopped after reaching its background time limit" in notification
    assert not [p for p in claude.leftovers() if p["argv"] == ["sleep", "30.75"]]


def test_a_task_that_ends_mid_turn_is_told_within_the_same_prompt(claude: ClaudeCode) -> None:
    claude.api.extend(
        [background("sleep 0.3; exit 0", "Quick"), foreground(python_sleep(2)), Text("done")]
    )

    claude.run(
        "go",
        settings=settings_with(claude, "p", {"UserPromptSubmit": [], "Stop": []}),
        allowed_tools=["Bash"],
    )

    typed, notification = (c.event for c in claude.hook_calls("UserPromptSubmit"))
    assert "<status>completed</status>" in notification["prompt"]
    assert notification["prompt_id"] == typed["prompt_id"]
    [stop] = claude.hook_calls("Stop")  # one Stop: the task never shows in background_tasks
    assert stop.event["background_tasks"] == []


def test_a_foreground_command_sent_to_the_background_with_ampersand_outlives_claude(
    claude: ClaudeCode,
) -> None:
    command = f"{python_sleep(64.5)} >/dev/null 2>&1 & echo launched"
    claude.api.extend([foreground(command), Text("done")])

    run = claude.run(
        "go", settings=settings_with(claude, "s", {"Stop": []}), allowed_tools=["Bash"]
    )

    assert run.returncode == 0
    [stop] = claude.hook_calls("Stop")
    assert stop.event["background_tasks"] == []  # not a task of Claude Code's
    [left] = [p for p in claude.leftovers() if "time.sleep(64.5)" in " ".join(p["argv"])]
    assert left["ppid"] != run.pid


def test_monitor_runs_its_command_like_a_background_bash(claude: ClaudeCode) -> None:
    monitor = ToolUse(
        "Monitor",
        {"command": "echo tick; sleep 1.5; echo tock", "description": "ticks", "timeout_ms": 20000},
    )
    claude.api.extend([monitor, Text("watching")])
    settings = settings_with(claude, "m", {"PostToolUse": [], "Stop": [], "UserPromptSubmit": []})

    run = claude.run("go", settings=settings, allowed_tools=["Monitor"])

    [posted] = claude.hook_calls("PostToolUse")
    task = posted.event["tool_response"]["taskId"]
    assert posted.event["tool_response"]["persistent"] is False
    first_stop = claude.hook_calls("Stop")[0]
    assert first_stop.event["background_tasks"][0]["id"] == task
    assert first_stop.event["background_tasks"][0]["type"] == "monitor"
    prompts = [c.event["prompt"] for c in claude.hook_calls("UserPromptSubmit")]
    assert any("<event>tick</event>" in prompt for prompt in prompts)
    assert "stream ended" in prompts[-1]
    assert run.returncode == 0


# -- what claude keeps on disk -------------------------------------------------


def test_a_running_claude_keeps_a_session_file_named_after_its_pid(claude: ClaudeCode) -> None:
    release = threading.Event()
    claude.api.extend([held(release, Text("ok"))])
    started = claude.start("go")
    claude.api.wait_for_turns(1)

    session_file = claude.home / ".claude" / "sessions" / f"{started.pid}.json"
    record = json.loads(session_file.read_text())
    stat = Path(f"/proc/{started.pid}/stat").read_text()
    start_ticks = stat[stat.rindex(")") + 2 :].split()[19]
    release.set()
    run = started.finish()

    assert record["pid"] == started.pid
    assert record["procStart"] == start_ticks  # field 22 of /proc/PID/stat
    assert record["cwd"] == str(claude.project)
    assert re.fullmatch(r"[0-9a-f-]{36}", record["sessionId"])
    assert run.returncode == 0 and not session_file.exists()  # removed at a clean exit


# -- settings and MCP ----------------------------------------------------------


def test_project_settings_are_read_from_the_start_directory_local_ones_from_the_repository(
    claude: ClaudeCode,
) -> None:
    for scope in ("project", "local"):
        claude.write_json(
            claude.settings_path(scope),
            hook_settings({"SessionStart": recorder_command(claude.root / scope)}),
        )
    subprocess.run(["git", "init", "-q", str(claude.project)], check=True)
    below = claude.project / "src"
    below.mkdir()
    claude.api.extend([Text("from the root"), Text("from below")])

    claude.run("go", cwd=claude.project)
    claude.run("go", cwd=below)

    assert len(hook_calls(claude.root / "project")) == 1  # from the root only
    assert len(hook_calls(claude.root / "local")) == 2  # from the root and from below


def test_mcp_servers_in_settings_files_are_not_started(claude: ClaudeCode) -> None:
    logs = {name: claude.root / f"{name}.jsonl" for name in ("user", "project", "flag", "config")}

    def servers(name: str) -> dict[str, object]:
        argv = mcp_recorder_argv(logs[name])
        return {"mcpServers": {name: {"command": argv[0], "args": argv[1:]}}}

    claude.write_json(claude.settings_path("user"), servers("user"))
    claude.write_json(claude.settings_path("project"), servers("project"))
    flag = claude.write_json(claude.root / "flag.json", servers("flag"))
    config = claude.write_json(claude.root / "mcp.json", servers("config"))
    claude.api.extend([Text("ok")])

    claude.run("go", settings=flag, args=["--mcp-config", str(config)])

    assert {name: bool(mcp_log(log, "start")) for name, log in logs.items()} == {
        "user": False,
        "project": False,
        "flag": False,
        "config": True,  # --mcp-config is read
    }


@pytest.mark.parametrize("how", ["exit", "SIGTERM", "SIGKILL"])
def test_how_an_mcp_server_learns_that_claude_is_gone(claude: ClaudeCode, how: str) -> None:
    log = claude.root / "mcp.jsonl"
    argv = mcp_recorder_argv(log)
    claude.write_json(
        claude.project / ".mcp.json",
        {"mcpServers": {"rec": {"command": argv[0], "args": argv[1:]}}},
    )
    release = threading.Event()
    claude.api.extend([ToolUse("mcp__rec__ping"), held(release, Text("ok"))])
    started = claude.start("go", allowed_tools=["mcp__rec__ping"])
    claude.api.wait_for_turns(2)

    if how != "exit":
        started.signal(getattr(signal, how))
    release.set()
    started.finish()

    last = wait_for(lambda: [e for e in mcp_log(log) if e["event"] in ("signal", "eof")])
    if how == "SIGKILL":
        assert last[0]["event"] == "eof"
    else:
        assert last[0] == {"event": "signal", "signum": signal.SIGINT, "ppid": started.pid}
