"""The real Claude Code, offline: what capsuled's integration rests on (docs/design.md §11, §12).

Each test drives the pinned binary (``claude -p``) through the Messages API
stand-in, with hooks that record what they are given (hook_recorder.py), and
asserts one fact of tests/claude_code/FINDINGS.md: what the hooks carry and
when they fire, where a background command runs, what a resume shows the
model, which settings files and MCP registrations ``-p`` reads. Skipped where
Claude Code is not installed (``make test-tools`` installs it).
"""

from __future__ import annotations

import json
import re
import signal
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

pytestmark = needs_claude


def background(command: str, description: str = "Run in the background") -> ToolUse:
    """A Bash call with ``run_in_background``: a background task of Claude Code's."""
    return ToolUse(
        "Bash", {"command": command, "description": description, "run_in_background": True}
    )


def task_id_in(request: Request) -> str:
    """The id of the background task the conversation started (from its tool_result)."""
    match = re.search(r"running in background with ID: (\w+)", request.text())
    assert match, "no background task in the conversation"
    return match.group(1)


def recording(claude: ClaudeCode, *events: str) -> Path:
    """A --settings file whose hooks record ``events`` into claude.hook_dir."""
    commands = {event: recorder_command(claude.hook_dir) for event in events}
    return claude.write_json(claude.root / "settings.json", hook_settings(commands))


def session_leader(pid: int) -> bool:
    """Whether ``pid`` leads its own session (setsid): field 6 of /proc/PID/stat is itself."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[3]) == pid


def environ(pid: int) -> dict[str, str]:
    """The environment of process ``pid``."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(entry.split("=", 1) for entry in raw.split("\0") if "=" in entry)


def the_process(claude: ClaudeCode, *argv: str) -> dict[str, object]:
    """The one live process of this user's runs whose argv is ``argv``."""
    return wait_for(
        lambda: next((p for p in claude.leftovers() if p["argv"] == list(argv)), None),
        message=f"a process {argv}",
    )


def test_a_prompt_gets_the_scripted_answer_offline(claude: ClaudeCode) -> None:
    claude.api.extend([Text("Hello from the stand-in")])

    run = claude.run("say hello")

    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "Hello from the stand-in"
    [turn] = run.turns
    assert turn.path.startswith("/v1/messages") and turn.body["stream"] is True
    assert "say hello" in turn.text()
    assert "Bash" in turn.tool_names
    assert claude.api.script_left == 0 and claude.api.unscripted == 0
    assert run.requests == run.turns  # nothing else asked: no probe, no count_tokens


def test_a_print_run_fires_its_hooks_and_names_the_claude_process(claude: ClaudeCode) -> None:
    events = ["SessionStart", "UserPromptSubmit", "Stop", "SessionEnd"]
    claude.api.extend([Text("ok")])

    run = claude.run("hi", settings=recording(claude, *events), args=["--output-format", "json"])

    assert run.returncode == 0, run.stderr
    session_id = run.result()["session_id"]
    calls = claude.hook_calls()
    assert [call.name for call in calls] == events
    start, prompt, stop, end = calls
    assert start.event["source"] == "startup"
    assert start.event["session_id"] == session_id
    assert start.event["cwd"] == str(claude.project)
    assert start.event["transcript_path"].endswith(f"/{session_id}.jsonl")
    # CLAUDE_PID is the claude process itself; the hook runs under /bin/sh -c, its child.
    assert start.env["CLAUDE_PID"] == str(run.pid)
    assert start.env["CLAUDE_CODE_SESSION_ID"] == session_id
    _hook, shell, parent = start.ancestry[:3]
    assert shell["argv"][:2] == ["/bin/sh", "-c"]
    assert parent["pid"] == run.pid
    assert prompt.event["prompt"] == "hi"
    assert stop.event["background_tasks"] == []
    assert end.event["reason"] == "other"  # SessionEnd fires in -p mode too
    assert {call.event["session_id"] for call in calls} == {session_id}


def test_a_background_bash_runs_under_claude_until_task_stop(claude: ClaudeCode) -> None:
    release = threading.Event()

    def stop_it(request: Request) -> ToolUse:
        release.wait(DEADLINE_S)  # hold the turn while the test looks at the processes
        return ToolUse("TaskStop", {"task_id": task_id_in(request)})

    claude.api.extend([background("sleep 41.25", "Sleep"), stop_it, Text("stopped")])
    started = claude.start(
        "go",
        settings=recording(claude, "PostToolUse", "Stop"),
        allowed_tools=["Bash", "TaskStop"],
    )
    claude.api.wait_for_turns(2)

    [posted] = claude.hook_calls("PostToolUse")
    assert posted.event["tool_name"] == "Bash"
    assert posted.event["tool_input"]["run_in_background"] is True
    assert posted.event["tool_input"]["command"] == "sleep 41.25"
    task = posted.event["tool_response"]["backgroundTaskId"]
    # The command runs under a /bin/bash -c wrapper, a child of claude in a session of its own.
    command = the_process(claude, "sleep", "41.25")
    wrapper = process(int(str(command["ppid"])))
    assert wrapper is not None
    assert wrapper["argv"][:2] == ["/bin/bash", "-c"]
    assert "eval 'sleep 41.25'" in wrapper["argv"][2]
    assert wrapper["ppid"] == started.pid
    assert session_leader(wrapper["pid"])
    # It carries its session and its claude in its environment.
    command_env = environ(int(str(command["pid"])))
    assert command_env["CLAUDE_CODE_SESSION_ID"] == posted.event["session_id"]
    assert command_env["CLAUDE_PID"] == str(started.pid)
    release.set()
    run = started.finish()

    assert run.returncode == 0, run.stderr
    stopped = claude.hook_calls("PostToolUse")[1]
    assert stopped.event["tool_name"] == "TaskStop"
    assert stopped.event["tool_response"]["task_id"] == task
    assert stopped.event["tool_response"]["task_type"] == "local_bash"
    assert stopped.event["tool_response"]["command"] == "sleep 41.25"
    [stop] = claude.hook_calls("Stop")
    assert stop.event["background_tasks"] == []
    wait_for(lambda: process(int(str(command["pid"]))) is None, message="the command stopped")


def test_a_background_task_that_ends_comes_back_as_a_prompt(claude: ClaudeCode) -> None:
    command = "sleep 2.5; exit 3"
    claude.api.extend([background(command, "Fail soon"), Text("waiting")])

    run = claude.run(
        "go", settings=recording(claude, "UserPromptSubmit", "Stop"), allowed_tools=["Bash"]
    )

    assert run.returncode == 0, run.stderr
    task = task_id_in(run.turns[1])
    first_stop, last_stop = claude.hook_calls("Stop")
    assert first_stop.event["background_tasks"] == [
        {
            "id": task,
            "type": "shell",
            "status": "running",
            "description": "Fail soon",
            "command": command,
        }
    ]
    # -p waits for the task; its end arrives as a new prompt, with a UserPromptSubmit.
    typed, notification = (call.event for call in claude.hook_calls("UserPromptSubmit"))
    assert typed["prompt"] == "go"
    assert notification["prompt"].startswith("<task-notification>")
    assert f"<task-id>{task}</task-id>" in notification["prompt"]
    assert "<status>failed</status>" in notification["prompt"]
    assert "failed with exit code 3" in notification["prompt"]
    assert notification["prompt_id"] != typed["prompt_id"]
    assert last_stop.event["background_tasks"] == []
    assert len(run.turns) == 3 and not run.turns[2].scripted
    assert f"<task-id>{task}</task-id>" in run.turns[2].text()


@pytest.mark.parametrize(
    ("signum", "survives"),
    [(signal.SIGKILL, True), (signal.SIGTERM, False)],
    ids=["SIGKILL", "SIGTERM"],
)
def test_what_a_killed_claude_leaves_of_a_background_command(
    claude: ClaudeCode, signum: signal.Signals, survives: bool
) -> None:
    claude.api.extend([background("sleep 42.5", "Sleep"), Text("started")])
    started = claude.start(
        "go", settings=recording(claude, "Stop", "SessionEnd"), allowed_tools=["Bash"]
    )
    wait_for(lambda: claude.hook_calls("Stop"), message="the first Stop")
    command = the_process(claude, "sleep", "42.5")

    session_file = claude.home / ".claude" / "sessions" / f"{started.pid}.json"
    assert session_file.is_file()

    started.signal(signum)
    run = started.finish()

    assert run.returncode == (-signal.SIGKILL if survives else 128 + signal.SIGTERM)
    if survives:
        # No SessionEnd; the wrapper and its command live on, re-parented.
        assert claude.hook_calls("SessionEnd") == []
        wrapper = process(int(str(command["ppid"])))
        assert process(int(str(command["pid"]))) is not None
        assert wrapper is not None and wrapper["ppid"] != started.pid
        assert session_file.is_file()  # claude's own record of itself, left stale
    else:
        [end] = claude.hook_calls("SessionEnd")
        assert end.event["reason"] == "other"
        wait_for(lambda: process(int(str(command["pid"]))) is None, message="the command gone")
        assert not session_file.exists()


def test_resume_keeps_the_session_id_and_its_context_reaches_the_model(
    claude: ClaudeCode,
) -> None:
    claude.api.extend([Text("first"), Text("second")])
    context = "capsuled: 1 background command of this session was lost"
    answer = {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": context}}
    resume_settings = claude.write_json(
        claude.root / "resume.json",
        hook_settings(
            {"SessionStart": recorder_command(claude.hook_dir, "--print", json.dumps(answer))}
        ),
    )

    first = claude.run(
        "one", settings=recording(claude, "SessionStart"), args=["--output-format", "json"]
    )
    session_id = first.result()["session_id"]
    second = claude.run(
        "two", resume=session_id, settings=resume_settings, args=["--output-format", "json"]
    )

    assert second.returncode == 0, second.stderr
    assert second.result()["session_id"] == session_id
    startup, resume = claude.hook_calls("SessionStart")
    assert (startup.event["source"], resume.event["source"]) == ("startup", "resume")
    assert resume.event["session_id"] == session_id
    assert resume.event["transcript_path"] == startup.event["transcript_path"]
    assert resume.env["CLAUDE_PID"] == str(second.pid) != str(first.pid)
    assert resume.env["CLAUDE_CODE_SESSION_ID"] == session_id
    assert context in second.turns[0].text()
    assert context not in first.turns[0].text()


def test_resume_tells_the_model_a_task_lost_to_sigkill_stopped_while_it_still_runs(
    claude: ClaudeCode,
) -> None:
    claude.api.extend([background("sleep 62.5"), Text("started"), Text("resumed")])
    settings = recording(claude, "Stop", "UserPromptSubmit")
    started = claude.start("go", settings=settings, allowed_tools=["Bash"])
    [stop] = wait_for(lambda: claude.hook_calls("Stop"))
    task = stop.event["background_tasks"][0]["id"]
    started.signal(signal.SIGKILL)
    started.finish()

    resumed = claude.run("and now?", settings=settings, resume=stop.event["session_id"])

    assert resumed.returncode == 0
    # Claude Code itself tells the model, in the resume's first request, that the
    # task did not finish ("stopped"), without looking whether it still runs.
    told = resumed.turns[0].text()
    assert f"<task-id>{task}</task-id>" in told and "<status>stopped</status>" in told
    assert "didn't finish before the previous session ended" in told
    prompts = [call.event["prompt"] for call in claude.hook_calls("UserPromptSubmit")]
    assert prompts == ["go", "and now?"]  # no hook hears that notification
    assert claude.hook_calls("Stop")[1].event["background_tasks"] == []
    assert [p for p in claude.leftovers() if p["argv"] == ["sleep", "62.5"]]  # it does run


def test_print_mode_reads_hooks_from_every_settings_scope(claude: ClaudeCode) -> None:
    def recorder_into(name: str) -> dict[str, object]:
        command = recorder_command(claude.root / f"hooks-{name}")
        return hook_settings({"SessionStart": command})

    for scope in ("user", "project", "local"):
        claude.write_json(claude.settings_path(scope), recorder_into(scope))
    flag = claude.write_json(claude.root / "flag.json", recorder_into("flag"))
    claude.api.extend([Text("ok")])

    run = claude.run("hi", settings=flag)

    assert run.returncode == 0, run.stderr
    for name in ("user", "project", "local", "flag"):
        assert len(hook_calls(claude.root / f"hooks-{name}", "SessionStart")) == 1, name


def test_mcp_add_writes_each_scope_and_print_mode_starts_them_under_claude(
    claude: ClaudeCode,
) -> None:
    scopes = ("user", "project", "local")
    logs = {scope: claude.root / f"mcp-{scope}.jsonl" for scope in scopes}
    for scope in scopes:
        argv = mcp_recorder_argv(logs[scope])
        done = claude.cli("mcp", "add", "--scope", scope, f"rec-{scope}", "--", *argv)
        assert done.returncode == 0, done.stderr

    state = json.loads((claude.home / ".claude.json").read_text())
    assert set(state["mcpServers"]) == {"rec-user"}
    assert set(state["projects"][str(claude.project)]["mcpServers"]) == {"rec-local"}
    project_file = json.loads((claude.project / ".mcp.json").read_text())
    assert set(project_file["mcpServers"]) == {"rec-project"}

    tools = [f"mcp__rec-{scope}__ping" for scope in scopes]
    claude.api.extend([[ToolUse(tool) for tool in tools], Text("done")])
    run = claude.run("ping", allowed_tools=tools, args=["--output-format", "json"])

    # All three run in -p mode, the project's .mcp.json one without any approval.
    assert run.returncode == 0, run.stderr
    session_id = run.result()["session_id"]
    pids = []
    for scope in scopes:
        [start] = mcp_log(logs[scope], "start")
        assert start["ancestry"][1]["pid"] == run.pid, scope  # a direct child of claude
        assert start["env"]["CLAUDE_CODE_SESSION_ID"] == session_id
        assert "CLAUDE_PID" not in start["env"]
        pids.append(start["pid"])
    answers = sorted(result_text(block) for block in run.turns[1].tool_results())
    assert answers == sorted(f"pong from {pid}" for pid in pids)
