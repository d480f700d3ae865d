"""The demo runtime leaves a trace that a resumed session reconciles, as the README shows."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from capsule_client.paths import records_root
from capsuled.reconcile import reconcile

DEMO = Path(__file__).parents[1] / "examples" / "demo_runtime.py"


def test_the_demo_session_reconciles_to_its_two_detached_execs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, DEMO, "--home", str(home), "--sleep-s", "60"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    kill_all = re.search(r"^Kill all: kill ([\d ]+)$", result.stdout, re.MULTILINE)
    assert kill_all, result.stdout
    try:
        resume = re.search(
            r"^Resume:   capsulectl reconcile (ses_demo_\w+) --as ses_resumed --context (\S+)$",
            result.stdout,
            re.MULTILINE,
        )
        assert resume, result.stdout
        session_id, context_id = resume.groups()
        report = reconcile(records_root(home), session_id, "ses_resumed", context_id)
        assert report is not None
        assert report.started_in_session == session_id
        assert report.context_id == context_id
        assert report.provenance.trust == "trusted"
        assert [work.work_id for work in report.lost] == [
            f"exe_{session_id.removeprefix('ses_')}_build",
            f"exe_{session_id.removeprefix('ses_')}_test",
        ]
        assert {work.binary for work in report.lost} == {"sleep"}
        assert reconcile(records_root(home), session_id, "ses_other", context_id) is None
    finally:
        for pid in (int(pid) for pid in kill_all.group(1).split()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
