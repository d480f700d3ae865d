"""examples/demo_runtime.py runs with only the package and makes a session the reader sees."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from sessions_support import proc_state
from support import wait_until

from capsuled.reader import ActiveSessionReader

DEMO = Path(__file__).parents[1] / "examples" / "demo_runtime.py"


def test_demo_runtime_makes_a_session_and_a_killed_process_leaves(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, DEMO, "--home", str(home), "--sleep-s", "60"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    match = re.search(r"^Kill all: kill ([\d ]+)$", result.stdout, re.MULTILINE)
    assert match, result.stdout
    pids = [int(pid) for pid in match.group(1).split()]
    try:
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
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_demo_runtime_imports_only_the_client() -> None:
    code = (
        "import runpy, sys;"
        f"runpy.run_path({str(DEMO)!r}, run_name='demo');"
        "bad = {'capsuled', 'psutil', 'watchfiles', 'structlog'} & set(sys.modules);"
        "print(*sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
