"""Reconcile's markers reach the trace in one write, fsynced before the report (docs/design.md §6).

Watched from outside with ``strace``: the system calls a real reconcile makes
on the trace's descriptor, in the order the kernel saw them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

CHILD = """
import sys
from capsuled.reconcile.prior_session import reconcile
report = reconcile(sys.argv[1], "ses_prior", "ses_resumed", "ctx")
sys.stdout.write("REPORT " + " ".join(work.work_id for work in report.lost) + "\\n")
sys.stdout.flush()
"""


def test_all_markers_go_in_one_write_and_are_fsynced_before_the_report(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "ses_prior").mkdir(parents=True, mode=0o700)
    lines = [
        {"event_type": "session_start", "event_id": "evt_start"},
        *(
            {"event_type": "shell_detached", "work_id": f"wrk_{n}", "binary": "sh"}
            for n in range(3)
        ),
    ]
    trace = root / "ses_prior/trace.jsonl"
    # A torn tail: the markers must start on a new line, still in the same write.
    before = "".join(json.dumps(line) + "\n" for line in lines) + '{"event_ty'
    trace.write_text(before)
    log = tmp_path / "strace.log"
    strace = ["strace", "-f", "-qq", "-s", "0", "-e", "trace=openat,write,fsync,fdatasync"]
    result = subprocess.run(
        [*strace, "-o", str(log), sys.executable, "-c", CHILD, str(root)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if "ptrace" in result.stderr or "Operation not permitted" in result.stderr:
        pytest.skip(f"strace cannot trace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "REPORT wrk_0 wrk_1 wrk_2\n"

    calls = log.read_text().splitlines()
    opened = [
        int(match.group(1))
        for call in calls
        if (match := re.search(r'openat\(.*"trace\.jsonl", [^)]*O_APPEND[^)]*\) = (\d+)', call))
    ]
    assert len(opened) == 1, calls
    fd = opened[0]
    writes = [i for i, call in enumerate(calls) if re.search(rf"\bwrite\({fd}, ", call)]
    syncs = [i for i, call in enumerate(calls) if re.search(rf"\b(fsync|fdatasync)\({fd}\)", call)]
    report = [i for i, call in enumerate(calls) if re.search(r"\bwrite\(1, ", call)]
    assert len(writes) == 1, [calls[i] for i in writes]
    assert syncs and report
    assert writes[0] < syncs[0] < report[0]

    text = trace.read_text()
    assert text.endswith("\n")
    markers = [json.loads(line) for line in text.splitlines()[len(lines) + 1 :]]
    assert [m["work_id"] for m in markers] == ["wrk_0", "wrk_1", "wrk_2"]
    assert all(m["event_type"] == "shell_lost" for m in markers)
    # The single write carried the whole payload: its byte count is the markers' length.
    written = int(calls[writes[0]].rsplit("= ", 1)[1])
    assert written == len(text) - len(before)
