"""``capsulectl hook claude-code`` on real stdin JSON, as Claude Code runs it (docs/design.md
§12): what each event records in a real home's store and trace, and that whatever the
input or the home, the hook exits 0 with at most one line on stderr and writes nothing
half-way.

Each run is a whole process (``python -m capsule_client.cli hook claude-code``), its home
under tmp_path; the events are shaped as tests/claude_code/FINDINGS.md measured them.
The resume tests run a real daemon.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import Processes
from helpers.userns import UNSHARE, user_namespaces_work
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.agents.claude_code_hook import STORE_TIMEOUT_S
from capsule_client.kit.paths import store_path
from capsule_client.kit.store import OwnershipStore

HOOK = [sys.executable, "-m", "capsule_client.cli", "hook", "claude-code"]
CLAUDE_ID = "3f1c8a52-6d0e-4b7a-9c51-2e8f0a4d7b16"
SESSION = f"ses_claude_{CLAUDE_ID}"


def env_for(home: Path, socket: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAUDE", "CAPSULE"))}
    env.update(CAPSULE_HOME=str(home), CAPSULED_SOCKET=str(socket or home.parent / "no.sock"))
    env.update(extra)
    return env


def run_hook(
    home: Path,
    event: dict[str, Any] | bytes,
    *,
    socket: Path | None = None,
    argv: list[str] = HOOK,
    **extra: Any,
) -> subprocess.CompletedProcess[str]:
    data = event if isinstance(event, bytes) else json.dumps(event).encode()
    done = subprocess.run(
        argv,
        input=data.decode(errors="surrogateescape"),
        env=env_for(home, socket, **{k: v for k, v in extra.items() if k != "preexec_fn"}),
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=60,
        preexec_fn=extra.get("preexec_fn"),
    )
    assert done.returncode == 0, (done.returncode, done.stderr)  # never anything else
    assert done.stderr.count("\n") <= 1, done.stderr  # at most one line
    return done


def event(name: str, **members: Any) -> dict[str, Any]:
    return {
        "session_id": CLAUDE_ID,
        "transcript_path": f"/home/u/.claude/projects/-p/{CLAUDE_ID}.jsonl",
        "cwd": "/home/u/project",
        "hook_event_name": name,
        **members,
    }


def start(source: str = "startup") -> dict[str, Any]:
    return event("SessionStart", source=source)


def prompt(text: str) -> dict[str, Any]:
    return event("UserPromptSubmit", prompt=text, prompt_id="p1", permission_mode="default")


def background(command: str, task: str) -> dict[str, Any]:
    return event(
        "PostToolUse",
        tool_name="Bash",
        tool_input={"command": command, "description": "d", "run_in_background": True},
        tool_response={"stdout": "", "stderr": "", "interrupted": False, "backgroundTaskId": task},
        tool_use_id="toolu_1",
    )


def stop(*running: str) -> dict[str, Any]:
    tasks = [
        {"id": task, "type": "shell", "status": "running", "description": "d", "command": "c"}
        for task in running
    ]
    return event("Stop", stop_hook_active=False, background_tasks=tasks)


def task_stop(task: str) -> dict[str, Any]:
    return event(
        "PostToolUse",
        tool_name="TaskStop",
        tool_input={"task_id": task},
        tool_response={"message": f"Successfully stopped task: {task}", "task_id": task},
    )


def notification(task: str, status: str, summary: str) -> dict[str, Any]:
    return prompt(
        f"<task-notification>\n<task-id>{task}</task-id>\n<tool-use-id>toolu_1</tool-use-id>\n"
        f"<output-file>/tmp/x/{task}.output</output-file>\n<status>{status}</status>\n"
        f"<summary>{summary}</summary>\n</task-notification>"
    )


def trace(home: Path, session: str = SESSION) -> list[dict[str, Any]]:
    path = home / "sessions" / session / "trace.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kinds(home: Path) -> list[str]:
    return [line["event_type"] for line in trace(home)]


def rows(home: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(store_path(home)) as db:
        return db.execute(sql).fetchall()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    return path


# -- what each event records ------------------------------------------------------


def test_session_start_registers_the_session_its_agent_and_starts_the_trace(home: Path) -> None:
    done = run_hook(home, start(), CLAUDE_PID=str(os.getpid()))

    assert done.stdout == "" and done.stderr == ""
    assert kinds(home) == ["session_start"]
    assert rows(home, "SELECT session_id, context_id, title FROM sessions") == [
        (SESSION, "/home/u/project", "Claude Code")
    ]
    [(pid, started_at, session)] = rows(
        home, "SELECT pid, started_at, session_id FROM session_processes"
    )
    assert (pid, session) == (os.getpid(), SESSION)
    assert abs(started_at - psutil_start(os.getpid())) <= 1


def psutil_start(pid: int) -> float:
    from capsule_client.kit.proc import process_start_time

    return process_start_time(pid)


def test_the_agent_is_claude_pid_when_an_ancestor_else_the_nearest_ancestor_not_a_shell(
    home: Path, procs: Processes
) -> None:
    """The hook runs as hook → /bin/sh -c → the agent (here: this test)."""
    through_shell = ["/bin/sh", "-c", " ".join(HOOK) + "; true"]
    stranger = procs.sleep()

    run_hook(home, start(), argv=through_shell)  # no CLAUDE_PID
    run_hook(home, start("resume"), argv=through_shell, CLAUDE_PID=str(stranger.pid))

    registered = {pid for (pid,) in rows(home, "SELECT pid FROM session_processes")}
    assert registered == {os.getpid()}  # never the shell, never a pid that is no ancestor


def test_prompts_start_trusted_tasks_and_a_background_bash_is_detached_in_the_current_one(
    home: Path,
) -> None:
    run_hook(home, start())
    run_hook(home, prompt("start the dev server"))
    run_hook(home, background("npm run dev", "bk1a2b3c4"))

    started, task, detached = trace(home)
    assert task["event_type"] == "task_start" and task["trust"] == "trusted"
    assert task["task_id"].startswith("tsk_") and len(task["task_id"]) == 36
    assert detached == {
        "event_type": "shell_detached",
        "event_id": detached["event_id"],
        "session_id": SESSION,
        "timestamp": detached["timestamp"],
        "task_id": task["task_id"],
        "work_id": "bk1a2b3c4",
        "binary": "/bin/bash",  # its process gone already: the shell measured
        "command": "npm run dev",
    }
    assert started["event_id"] < task["event_id"] < detached["event_id"]


def test_a_foreground_bash_and_other_tools_record_nothing(home: Path) -> None:
    run_hook(home, start())
    foreground = background("ls", "b1")
    foreground["tool_input"]["run_in_background"] = False
    read = event("PostToolUse", tool_name="Read", tool_input={"file_path": "/x"}, tool_response={})

    for quiet in (foreground, read, event("SessionEnd", reason="other"), event("Notification")):
        done = run_hook(home, quiet)
        assert done.stdout == done.stderr == ""
    assert kinds(home) == ["session_start"]


def test_a_notification_is_the_end_of_a_background_command_not_a_task(home: Path) -> None:
    run_hook(home, start())
    run_hook(home, prompt("go"))
    for task in ("bok", "bfail", "blimit", "bstop"):
        run_hook(home, background(f"work {task}", task))

    run_hook(
        home, notification("bok", "completed", 'Background command "d" completed (exit code 0)')
    )
    run_hook(
        home, notification("bfail", "failed", 'Background command "d" failed with exit code 3')
    )
    limit = 'Background command "d" was stopped after reaching its background time limit'
    run_hook(home, notification("blimit", "killed", limit))
    run_hook(
        home, notification("bstop", "stopped", "didn't finish before the previous session ended")
    )
    run_hook(home, notification("bunknown", "completed", "(exit code 0)"))

    lines = trace(home)
    assert [line["event_type"] for line in lines].count("task_start") == 1  # the typed prompt
    ends = {line["work_id"]: line for line in lines[6:]}
    assert set(ends) == {"bok", "bfail", "blimit"}  # "stopped" is a guess; bunknown not ours
    assert ends["bok"]["event_type"] == "shell_completed"
    assert (ends["bok"]["status"], ends["bok"]["exit_code"]) == ("completed", 0)
    assert (ends["bfail"]["status"], ends["bfail"]["exit_code"]) == ("failed", 3)
    assert ends["bok"]["completion_task_id"] == lines[1]["task_id"]
    assert ends["blimit"]["event_type"] == "shell_abandoned"
    assert ends["blimit"]["command"] == "work blimit"


def test_task_stop_abandons_a_work_once(home: Path) -> None:
    run_hook(home, start())
    run_hook(home, background("sleep 50", "bx"))

    run_hook(home, task_stop("bx"))
    run_hook(home, task_stop("bx"))
    run_hook(home, notification("bx", "completed", "(exit code 0)"))

    assert kinds(home) == ["session_start", "shell_detached", "shell_abandoned"]


def test_stop_completes_what_this_process_detached_and_no_longer_runs(home: Path) -> None:
    run_hook(home, start())
    run_hook(home, background("sleep 1", "bdone"))
    run_hook(home, background("sleep 50", "brun"))

    run_hook(home, stop("brun"))
    run_hook(home, stop("brun"))  # once per work

    done = trace(home)[3:]
    assert [(line["event_type"], line["work_id"]) for line in done] == [
        ("shell_completed", "bdone")
    ]
    assert "status" not in done[0] and "exit_code" not in done[0]  # not known


def test_a_resumed_process_s_stop_leaves_the_previous_process_s_work_to_reconcile(
    home: Path,
) -> None:
    """Claude Code's Stop after a resume lists no task of the process before: they are
    lost, not completed."""
    run_hook(home, start())
    run_hook(home, background("sleep 500", "bold"))
    run_hook(home, start("resume"))  # no daemon: not reconciled now

    run_hook(home, stop())

    assert kinds(home) == ["session_start", "shell_detached", "session_start"]


def test_a_compaction_in_the_same_process_starts_no_new_session_start(home: Path) -> None:
    run_hook(home, start())
    run_hook(home, background("sleep 500", "bkeep"))

    run_hook(home, start("compact"))
    run_hook(home, stop())

    assert kinds(home) == ["session_start", "shell_detached", "shell_completed"]


def test_a_fork_is_a_new_session(home: Path) -> None:
    forked = {**start("fork"), "session_id": "9d0e6a1b-0000-4000-8000-000000000001"}

    run_hook(home, forked)

    assert [
        line["event_type"]
        for line in trace(home, "ses_claude_9d0e6a1b-0000-4000-8000-000000000001")
    ] == ["session_start"]


# -- fail open --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"{not json", "the input is not JSON"),
        (b"", "the input is not JSON"),
        (b"[1, 2]", "is a JSON list, not an object"),
        (b"\xff\xfe\x00", "nothing recorded"),
        (json.dumps({**start(), "session_id": "../../etc"}).encode(), "$.session_id"),
        (json.dumps({**start(), "session_id": "ses/x"}).encode(), "$.session_id"),
        (json.dumps({**start(), "session_id": "a" * 129}).encode(), "$.session_id"),
        (json.dumps({**start(), "session_id": 12}).encode(), "$.session_id"),
        (json.dumps({**prompt("x"), "prompt": None}).encode(), "$.prompt"),
        (json.dumps(background("x", "../up")).encode(), "$.backgroundTaskId"),
        (json.dumps(background("x", "b1")).replace('"x"', "5").encode(), "$.command"),
        (json.dumps({**stop(), "background_tasks": 5}).encode(), "$.background_tasks"),
    ],
    ids=[
        "truncated", "empty", "a-list", "not-utf8", "dotdot-id", "slash-id", "long-id",
        "number-id", "null-prompt", "odd-task-id", "number-command", "tasks-a-number",
    ],
)  # fmt: skip
def test_input_that_does_not_fit_is_one_stderr_line_and_nothing_recorded(
    home: Path, data: bytes, said: str
) -> None:
    done = run_hook(home, data)

    assert done.stdout == ""
    assert done.stderr.startswith("capsulectl hook claude-code: ") and said in done.stderr
    assert "nothing recorded" in done.stderr
    assert list(home.iterdir()) == []  # no store, no session directory, no path made of it


def test_a_locked_store_is_given_up_on_soon_and_the_trace_is_still_written(home: Path) -> None:
    with OwnershipStore(store_path(home)) as store:
        store.register_session("ses_other")
    holder = sqlite3.connect(store_path(home), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        done = run_hook(home, start())
        elapsed = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    assert "the store was not written: database is locked" in done.stderr
    assert elapsed < STORE_TIMEOUT_S + 20  # about a second, not the kit's five
    assert kinds(home) == ["session_start"]
    assert rows(home, "SELECT session_id FROM sessions") == [("ses_other",)]


def test_a_full_disk_leaves_the_trace_as_it_was(home: Path) -> None:
    """The hook's writes may not grow a file past a few bytes (``RLIMIT_FSIZE``, as a
    full disk refuses them): the append fails whole and the trace is cut back."""
    run_hook(home, start())
    run_hook(home, prompt("go"))
    before = (home / "sessions" / SESSION / "trace.jsonl").read_bytes()

    def full() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 10, len(before) + 10))

    done = run_hook(home, background("sleep 9", "bfull"), preexec_fn=full)

    assert "the trace of" in done.stderr and "File too large" in done.stderr
    assert (home / "sessions" / SESSION / "trace.jsonl").read_bytes() == before


@pytest.mark.skipif(not user_namespaces_work(), reason="no user namespaces here")
def test_a_read_only_home_is_one_stderr_line_and_claude_code_goes_on(home: Path) -> None:
    run_hook(home, start())
    before = sorted(str(p) for p in home.rglob("*"))
    read_only = [
        *UNSHARE, "--mount", "sh", "-c",
        'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"', str(home), *HOOK,
    ]  # fmt: skip

    for step in (prompt("go"), background("sleep 9", "bro"), start("resume")):
        done = run_hook(home, step, argv=read_only)
        assert "Read-only file system" in done.stderr or "readonly database" in done.stderr

    assert sorted(str(p) for p in home.rglob("*")) == before
    assert kinds(home) == ["session_start"]


def test_a_terminal_on_stdin_or_an_unknown_agent_exits_1_never_2() -> None:
    assert (
        subprocess.run([*HOOK[:-1], "codex"], input="{}", text=True, capture_output=True).returncode
        == 1
    )


def test_the_log_says_what_each_run_did(home: Path, tmp_path: Path) -> None:
    log = tmp_path / "hook.log"

    run_hook(home, start(), CAPSULE_HOOK_LOG=str(log))
    run_hook(home, b"nope", CAPSULE_HOOK_LOG=str(log))

    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert first["event"] == "SessionStart" and first["problems"] == []
    assert "session_start" in first["did"]
    assert second["event"] is None and "not JSON" in second["problems"][0]


# -- resume -------------------------------------------------------------------------


@pytest.fixture
def served(short_dir: Path) -> Iterator[DaemonProcess]:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with DaemonProcess(home, short_dir / "d.sock") as daemon:
        yield daemon


def context_of(done: subprocess.CompletedProcess[str]) -> str:
    answer = json.loads(done.stdout)
    assert answer["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    context: str = answer["hookSpecificOutput"]["additionalContext"]
    return context


WRAPPER = "source /dev/null && eval 'sleep 612.5' < /dev/null && pwd -P >| /dev/null"


def test_a_resume_is_told_what_was_lost_what_still_runs_and_only_once(
    served: DaemonProcess, procs: Processes
) -> None:
    home, sock = served.home, served.socket_path
    # The agent (this test) detached two commands; one still runs, under the shell
    # Claude Code runs it with; the other has ended without a word.
    wrapper = procs.start(["/bin/bash", "-c", WRAPPER])
    run_hook(home, start(), socket=sock)
    run_hook(home, prompt("go"), socket=sock)
    run_hook(home, background("sleep 612.5", "blive"), socket=sock)
    run_hook(home, background("make test", "bgone"), socket=sock)
    with OwnershipStore(store_path(home)) as store:  # the wrapper as the session's, like
        store.register_process(wrapper.pid, SESSION)  # a descendant of a killed Claude Code
    with Client(sock) as client:
        wait_until(
            lambda: len(next(s for s in client.snapshot(max_age_ms=0).sessions
                             if s.session_id == SESSION).processes) >= 3,
            timeout_s=10.0, message="the wrapper and its sleep listed",
        )  # fmt: skip

    done = run_hook(home, start("resume"), socket=sock)

    context = context_of(done)
    assert "this session's previous Claude Code process started 2 background commands" in context
    assert 'command "sleep 612.5"' in context and 'command "make test"' in context
    assert "Provenance: completion; trust: trusted" in context
    [live] = [line for line in context.splitlines() if line.startswith("- blive is ")]
    [sleep] = [pid for pid in psutil_children(wrapper.pid)]
    assert f"- blive is STILL RUNNING, as pid {wrapper.pid} (/bin/bash -c " in live
    assert f"pid {sleep} (sleep 612.5, running for" in live
    assert f"To stop it: `kill {wrapper.pid} {sleep}`" in live
    [gone] = [line for line in context.splitlines() if line.startswith("- bgone ")]
    assert gone.startswith("- bgone has ended: no process of this session runs it now")
    lost = [line for line in trace(home) if line["event_type"] == "shell_lost"]
    assert sorted(line["work_id"] for line in lost) == ["bgone", "blive"]
    assert lost[0]["reconciled_by_session"].startswith(f"{SESSION}-resume-")

    again = run_hook(home, start("resume"), socket=sock)

    assert again.stdout == "" and again.stderr == ""
    assert [line["event_type"] for line in trace(home)].count("shell_lost") == 2


def psutil_children(pid: int) -> list[int]:
    children: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        children += [int(p) for p in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return children


def test_without_a_daemon_the_next_resume_that_has_one_reports(
    served: DaemonProcess, tmp_path: Path
) -> None:
    home = served.home
    run_hook(home, start(), socket=served.socket_path)
    run_hook(home, background("sleep 700", "bwait"), socket=served.socket_path)

    down = run_hook(home, start("resume"), socket=tmp_path / "nobody.sock")

    assert down.stdout == ""
    assert "not reconciled (the next resume will be): capsuled is not running" in down.stderr
    up = run_hook(home, start("resume"), socket=served.socket_path)
    assert "- bwait has ended: no process of this session runs it now" in context_of(up)


def test_a_command_that_finished_while_the_session_ran_is_not_reported(
    served: DaemonProcess,
) -> None:
    home, sock = served.home, served.socket_path
    run_hook(home, start(), socket=sock)
    run_hook(home, background("sleep 1", "bquick"), socket=sock)
    run_hook(home, notification("bquick", "completed", "(exit code 0)"), socket=sock)

    done = run_hook(home, start("resume"), socket=sock)

    assert done.stdout == "" and done.stderr == ""
    assert "shell_lost" not in kinds(home)


def test_options_before_hook_go_through_the_parser_and_are_honoured(
    served: DaemonProcess, tmp_path: Path
) -> None:
    """``capsulectl --socket S hook claude-code``: the socket given, not the environment's."""
    home = served.home
    run_hook(home, start(), socket=served.socket_path)
    run_hook(home, background("sleep 800", "bsock"), socket=served.socket_path)
    argv = [*HOOK[:3], "--socket", str(served.socket_path), *HOOK[3:]]

    done = run_hook(home, start("resume"), socket=tmp_path / "nobody.sock", argv=argv)

    assert "- bsock has ended" in context_of(done)
    help_text = subprocess.run(
        [*HOOK[:4], "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert help_text.startswith("usage: capsulectl hook") and "claude-code" in help_text


def test_a_socket_path_too_long_is_no_usage_error_for_the_hook(home: Path) -> None:
    """The hook fails open even through the parser: the resume is not reconciled, said."""
    argv = [*HOOK[:3], "--socket", "/tmp/" + "x" * 120, *HOOK[3:]]

    done = run_hook(home, start("resume"), argv=argv)

    assert "not reconciled (the next resume will be)" in done.stderr
    assert kinds(home) == ["session_start"]
