"""examples/demo_runtime.py runs with only the package and makes a session the reader sees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sessions_support import proc_state
from support import DEMO, demo_session, wait_until

from capsuled.reader import ActiveSessionReader


def test_demo_runtime_makes_a_session_and_a_killed_process_leaves(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with demo_session(home) as (_, pids):
        snapshot = ActiveSessionReader(home).observe().snapshot
        assert snapshot.discovery == "ready"
        (session,) = snapshot.sessions
        assert session.session_id.startswith("ses_demo_")
        assert sorted(p.pid for p in session.processes) == sorted(pids)
        assert {p.kind for p in session.processes} == {"provider_client", "exec"}

        os.kill(pids[-1], signal.SIGKILL)
        wait_until(lambda: proc_state(pids[-1]) in (None, "Z"), message="the killed sleep gone")
        reader = ActiveSessionReader(home)
        (session,) = reader.observe().snapshot.sessions
        assert sorted(p.pid for p in session.processes) == sorted(pids[:-1])


def test_demo_runtime_imports_only_the_client() -> None:
    code = (
        "import runpy, sys;"
        f"runpy.run_path({str(DEMO)!r}, run_name='demo');"
        "bad = {'capsuled', 'psutil', 'watchfiles', 'structlog'} & set(sys.modules);"
        "print(*sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
