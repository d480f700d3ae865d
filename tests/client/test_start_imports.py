"""What each ``capsulectl`` command imports (docs/design.md §9 "Start-up").

Each command runs as a whole process, through the entry point the console
script calls, and says at its exit which modules it holds (``sys.modules``),
less those the interpreter holds for ``pass``. A careless import fails here,
not on a stopwatch; the times are the benchmarks' (scenario 20).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import Processes

from capsule_client.kit.paths import store_path
from capsule_client.kit.store import OwnershipStore

#: Said on stderr after everything else: the modules the process holds, one a line.
MARK = "-- modules --"
#: Prints them at exit, whatever the exit status.
AT_EXIT = (
    "import atexit, sys\n"
    f"atexit.register(lambda: sys.stderr.write('\\n'.join(['{MARK}', *sys.modules]) + '\\n'))\n"
)
#: ``capsulectl``'s console script, without the script file.
ENTRY_POINT = "from capsule_client.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"

#: What no command but ``mcp`` loads: the SDK, and anyio, which only it and AsyncClient use.
MCP_SDK = {"mcp", "mcp_types", "pydantic", "pydantic_core", "starlette", "uvicorn"}
#: What the client never loads: the daemon's libraries.
DAEMON_ONLY = {"capsuled", "psutil", "structlog", "watchfiles", "inotify_simple"}
#: The command modules of ``capsulectl``, one per command.
COMMANDS = {
    f"capsule_client.cli.{name}"
    for name in (
        "ping",
        "status",
        "sessions",
        "ports",
        "rescan",
        "metrics",
        "watch",
        "top",
        "reconcile",
        "terminate",
        "run",
        "mcp",
        "hook",
        "integrate",
    )
}


def imported(
    code: str, args: Sequence[str] = (), env: dict[str, str] | None = None, stdin: bytes = b""
) -> set[str]:
    """The modules ``python -c CODE ARGS`` holds at its exit (which must be 0)."""
    done = subprocess.run(
        [sys.executable, "-c", AT_EXIT + code, *args],
        env=env,
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stderr.decode().rsplit(MARK + "\n", 1)[1].split())


def capsulectl(*args: str, env: dict[str, str] | None = None, stdin: bytes = b"") -> set[str]:
    """The modules a run of ``capsulectl ARGS`` imported beyond the interpreter's own."""
    return imported(ENTRY_POINT, args, env, stdin) - imported("pass", (), env)


def tops(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_version_imports_nothing_but_the_version() -> None:
    modules = capsulectl("--version")

    assert not modules & {"argparse", "msgspec", "typing", "importlib.metadata", "pathlib"}
    assert not tops(modules) & (MCP_SDK | DAEMON_ONLY | {"anyio", "uuid_utils", "sqlite3"})
    assert {m for m in modules if m.startswith("capsule_client")} == {
        "capsule_client",
        "capsule_client.cli",
        "capsule_client.cli.main",
        "capsule_client.cli.exits",
        "capsule_client.wire",
        "capsule_client.wire.constants",
    }


def test_version_among_other_arguments_is_argparse_s() -> None:
    """Only the line ``--version`` alone is answered before parsing; the check can fail."""
    modules = capsulectl("--timeout", "3", "--version")

    assert "argparse" in modules and "msgspec" not in modules


@pytest.fixture
def session(daemon: DaemonProcess, procs: Processes) -> dict[str, str]:
    """The environment of a shell whose daemon lists one session with one process."""
    sleep = procs.sleep()
    with OwnershipStore(store_path(daemon.home)) as store:
        store.ensure_session("ses_start")
        store.register_process(sleep.pid, "ses_start")
    return {
        **os.environ,
        "CAPSULE_HOME": str(daemon.home),
        "CAPSULED_SOCKET": str(daemon.socket_path),
    }


@pytest.mark.parametrize("command", ["ping", "status", "sessions", "ports"])
def test_a_request_that_blocks_imports_its_command_and_no_anyio(
    command: str, session: dict[str, str]
) -> None:
    modules = capsulectl(command, env=session)

    assert "msgspec" in modules and "capsule_client.client" in modules  # it did ask
    assert modules & COMMANDS == {f"capsule_client.cli.{command}"}
    assert not tops(modules) & (MCP_SDK | DAEMON_ONLY | {"anyio"})
    assert "capsule_client.async_client" not in modules


def test_run_imports_no_anyio(session: dict[str, str]) -> None:
    modules = capsulectl("run", "--session", "ses_run", "--", "true", env=session)

    assert {"capsule_client.kit.launch", "capsule_client.kit.store"} <= modules
    assert modules & COMMANDS == {"capsule_client.cli.run"}
    assert not tops(modules) & (MCP_SDK | DAEMON_ONLY | {"anyio"})


def test_only_mcp_imports_the_sdk(session: dict[str, str]) -> None:
    """The check above can fail: ``capsulectl mcp`` (its stdin closed at once) loads it."""
    modules = capsulectl("mcp", env=session)

    assert {"mcp", "pydantic", "anyio"} <= tops(modules)
    assert modules & COMMANDS == {"capsule_client.cli.mcp"}
    assert not tops(modules) & {"capsuled", "psutil"}  # the SDK loads watchfiles itself


def test_the_package_imports_its_names_when_first_asked_for() -> None:
    code = (
        "import sys, capsule_client\n"
        "before = set(sys.modules)\n"
        "capsule_client.Client\n"
        "print(sorted(m for m in ('msgspec', 'anyio', 'capsule_client.client') if m in before))\n"
        "print('anyio' in sys.modules, 'capsule_client.client' in sys.modules)\n"
        "capsule_client.AsyncClient\n"
        "print('anyio' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == ["[]", "False True", "True"]


#: A ``PostToolUse`` of a foreground ``Bash``, as Claude Code gives it: the common case.
FOREGROUND = json.dumps(
    {
        "session_id": "3f1c8a52-6d0e-4b7a-9c51-2e8f0a4d7b16",
        "cwd": "/home/u/project",
        "hook_event_name": "PostToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "ls -la", "description": "List files"},
        "tool_response": {"stdout": "total 0", "stderr": "", "interrupted": False},
    }
).encode()


def test_a_hook_event_that_records_nothing_is_decided_with_the_standard_library(
    session: dict[str, str],
) -> None:
    """docs/design.md §12: the common case loads json, and no msgspec, parser or store."""
    modules = capsulectl("hook", "claude-code", env=session, stdin=FOREGROUND)

    assert "json" in modules and "capsule_client.agents.claude_code" in modules
    assert modules & COMMANDS == {"capsule_client.cli.hook"}
    assert not modules & {"argparse", "msgspec", "sqlite3", "typing", "uuid_utils", "pathlib"}
    assert not {m for m in modules if m.startswith("capsule_client.kit")}
    assert not tops(modules) & (MCP_SDK | DAEMON_ONLY | {"anyio"})


def test_a_hook_event_that_records_loads_msgspec_and_the_trace_but_no_store(
    session: dict[str, str],
) -> None:
    """The check above can fail: a background Bash records, through the trace alone."""
    detached = json.loads(FOREGROUND)
    detached["tool_input"]["run_in_background"] = True
    detached["tool_response"]["backgroundTaskId"] = "bimports1"

    modules = capsulectl("hook", "claude-code", env=session, stdin=json.dumps(detached).encode())

    assert {"msgspec", "capsule_client.kit.trace", "capsule_client.agents.claude_code_hook"} <= (
        modules
    )
    assert modules & COMMANDS == {"capsule_client.cli.hook"}
    assert not modules & {"argparse", "sqlite3", "capsule_client.kit.store"}
    assert not tops(modules) & (MCP_SDK | DAEMON_ONLY | {"anyio"})
    assert "capsule_client.client" not in modules  # no daemon asked
