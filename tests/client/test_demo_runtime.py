"""examples/demo_runtime.py runs with only the package and makes a session the reader sees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers.daemon import DaemonProcess
from helpers.demo import DEMO, demo_session
from helpers.processes import proc_state
from helpers.waits import wait_until

from capsuled.reader import ActiveSessionReader


def test_demo_runtime_makes_a_session_and_a_killed_process_leaves(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with demo_session(home) as (_, pids):
        snapshot = ActiveSessionReader(home).observe().snapshot
        assert snapshot.discovery == "ready"
        (session,) = snapshot.sessions
        assert session.session_id.startswith("ses_demo_")
        receipts = [p for p in session.processes if p.kind != "descendant"]
        assert sorted(p.pid for p in receipts) == sorted(pids)
        assert {p.kind for p in receipts} == {"provider_client", "exec"}
        # The build shell's two sleeps (and its subshell, if it has not exited yet).
        shell = pids[1]
        descendants = [p for p in session.processes if p.kind == "descendant"]
        assert len(descendants) in (2, 3) and {p.root_pid for p in descendants} == {shell}
        assert shell in {p.parent_pid for p in descendants}

        os.kill(pids[-1], signal.SIGKILL)
        wait_until(lambda: proc_state(pids[-1]) in (None, "Z"), message="the killed sleep gone")
        reader = ActiveSessionReader(home)
        (session,) = reader.observe().snapshot.sessions
        receipts = [p for p in session.processes if p.kind != "descendant"]
        assert sorted(p.pid for p in receipts) == sorted(pids[:-1])


def test_demo_runtime_imports_only_the_client() -> None:
    code = (
        "import runpy, sys;"
        f"runpy.run_path({str(DEMO)!r}, run_name='demo');"
        "bad = {'capsuled', 'psutil', 'watchfiles', 'structlog'} & set(sys.modules);"
        "print(*sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_lines_the_demo_prints_run_as_pasted_without_the_venv_on_path(
    daemon: DaemonProcess,
) -> None:
    """Without the venv's commands on PATH the demo names capsulectl by its path."""
    env = {**os.environ, "PATH": "/usr/bin:/bin", "CAPSULED_SOCKET": str(daemon.socket_path)}
    printed = subprocess.run(
        [sys.executable, DEMO, "--home", str(daemon.home), "--sleep-s", "60"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=True,
    ).stdout
    lines = dict(line.split(":", 1) for line in printed.splitlines() if line[:1].isupper())
    pids = lines["Kill all"].split()[1:]
    try:
        see_it = lines["See it"].strip()
        assert see_it == f"{Path(sys.executable).parent / 'capsulectl'} sessions"
        for line in (see_it, lines["Resume"].strip()):
            result = subprocess.run(
                ["bash", "-c", line], capture_output=True, text=True, timeout=30, env=env
            )
            assert result.returncode == 0, (line, result.stdout, result.stderr)
            assert "ses_demo_" in result.stdout
    finally:
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
