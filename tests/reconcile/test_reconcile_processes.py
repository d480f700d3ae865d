"""Reconcile across threads and processes: exactly once, and failures that write nothing.

Each child process calls ``capsuled.reconcile.prior_session.reconcile`` directly and prints
its outcome as one JSON line.  Children that must not write (a file-size
limit, a trace they may not read or write) really run under that limit or as
another user, so the failure is the kernel's, not a stand-in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers.waits import ChildOutput

from capsule_client.wire import LostReport
from capsuled.reconcile.prior_session import reconcile

CHILD = r"""
import json, os, resource, signal, sys
import msgspec
from capsuled.errors import RpcError
from capsuled.reconcile.prior_session import reconcile

args = json.loads(sys.argv[1])
if args.get("file_size_limit") is not None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (args["file_size_limit"], hard))
if args.get("as_nobody") and os.geteuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
print("ready", flush=True)
if args.get("wait_for_go"):
    sys.stdin.readline()
try:
    report = reconcile(args["root"], args["from_session"], args["this_session"], "ctx_1")
except RpcError as exc:
    outcome = {"code": exc.code, "message": exc.message, "cause": repr(exc.__cause__)}
else:
    outcome = {"report": None if report is None else msgspec.to_builtins(report)}
print(json.dumps(outcome), flush=True)
"""

WORKS = [f"wrk_{n:02d}" for n in range(6)]


def write_trace(root: Path, *, filler_lines: int = 0) -> Path:
    trace = root / "ses_prior" / "trace.jsonl"
    trace.parent.mkdir(parents=True, exist_ok=True)
    lines: list[dict[str, Any]] = [
        {"event_type": "session_start", "event_id": "evt_s", "session_id": "ses_prior"},
        {"event_type": "task_start", "task_id": "tsk_1", "trust": "trusted"},
    ]
    filler = {"event_type": "model_output", "text": "z" * 1000}
    for n, work_id in enumerate(WORKS):
        lines.append(
            {
                "event_type": "shell_detached",
                "timestamp": 1000 + n,
                "task_id": "tsk_1",
                "work_id": work_id,
                "binary": "/bin/sh",
                "command": f"sleep {n}",
            }
        )
        lines.extend([filler] * filler_lines)
    lines.append({"event_type": "shell_completed", "work_id": WORKS[0]})
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return trace


def lost_markers(trace: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in trace.read_bytes().splitlines()]
    return [r for r in records if r.get("event_type") == "shell_lost"]


def start_child(**args: Any) -> tuple[subprocess.Popen[str], ChildOutput]:
    """The child, once ready, and its output (which may hold its outcome already)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    output = ChildOutput(child.stdout)
    assert output.line() == b"ready"
    return child, output


def child_outcome(started: tuple[subprocess.Popen[str], ChildOutput]) -> dict[str, Any]:
    # Through the same ChildOutput: a child not told to wait may have written
    # its outcome with its ready line, into the one read that took both.
    child, output = started
    assert child.stdin is not None and child.stdout is not None
    child.stdin.close()
    outcome: dict[str, Any] = output.json(timeout_s=30)
    child.stdout.close()
    assert child.wait(timeout=30) == 0
    return outcome


def run_child(**args: Any) -> dict[str, Any]:
    return child_outcome(start_child(**args))


@pytest.fixture
def shared_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory another user can traverse when the tests run as root."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="capsuled-reconcile-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


# --------------------------------------------------------------------------
# Exactly once


def assert_reported_exactly_once(reports: list[dict[str, Any] | None], trace: Path) -> None:
    winners = [report for report in reports if report is not None]
    assert len(winners) == 1, f"{len(winners)} reports from {len(reports)} reconciles"
    (winner,) = winners
    assert [work["work_id"] for work in winner["lost"]] == WORKS[1:]
    markers = lost_markers(trace)
    assert sorted(marker["work_id"] for marker in markers) == WORKS[1:], "one marker per work"
    assert {marker["reconciled_task_id"] for marker in markers} == {winner["task_id"]}


def test_twenty_threads_report_each_work_exactly_once(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, filler_lines=200)
    start = threading.Barrier(20)

    def one(n: int) -> LostReport | None:
        start.wait(timeout=10)
        return reconcile(tmp_path, "ses_prior", f"ses_thread{n}", "ctx_1")

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))

    assert_reported_exactly_once([msgspec.to_builtins(result) for result in results], trace)


def test_twenty_processes_report_each_work_exactly_once(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, filler_lines=200)
    children = [
        start_child(
            root=str(tmp_path),
            from_session="ses_prior",
            this_session=f"ses_process{n}",
            wait_for_go=True,
        )
        for n in range(20)
    ]
    for child, _ in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()

    outcomes = [child_outcome(child) for child in children]

    assert all("report" in outcome for outcome in outcomes), outcomes
    assert_reported_exactly_once([outcome["report"] for outcome in outcomes], trace)


# --------------------------------------------------------------------------
# Failures write nothing and report nothing


def test_a_failed_append_is_rolled_back_and_reports_nothing(tmp_path: Path) -> None:
    trace = write_trace(tmp_path)
    before = trace.read_bytes()

    # The kernel accepts 40 bytes of the markers (a short write), then refuses the rest.
    outcome = run_child(
        root=str(tmp_path),
        from_session="ses_prior",
        this_session="ses_resumed",
        file_size_limit=len(before) + 40,
    )

    assert outcome["code"] == -32603
    assert "could not append 5 shell_lost marker(s)" in outcome["message"]
    assert "File too large" in outcome["message"], "the cause is named"
    assert "nothing is reported" in outcome["message"]
    assert trace.read_bytes() == before, "the partial markers were cut away"
    report = reconcile(tmp_path, "ses_prior", "ses_resumed", "ctx_1")
    assert report is not None and len(report.lost) == 5, "the work is still reported later"


def test_an_unreadable_trace_is_an_internal_error(shared_dir: Path) -> None:
    trace = write_trace(shared_dir)
    before = trace.read_bytes()
    trace.chmod(0o000)

    outcome = run_child(
        root=str(shared_dir), from_session="ses_prior", this_session="ses_resumed", as_nobody=True
    )

    assert outcome["code"] == -32603
    assert "Permission denied" in outcome["message"]
    assert "PermissionError" in outcome["cause"]
    trace.chmod(0o600)
    assert trace.read_bytes() == before


def test_a_trace_that_cannot_be_appended_to_reports_nothing(shared_dir: Path) -> None:
    trace = write_trace(shared_dir)
    before = trace.read_bytes()
    trace.chmod(0o444)

    outcome = run_child(
        root=str(shared_dir), from_session="ses_prior", this_session="ses_resumed", as_nobody=True
    )

    assert outcome["code"] == -32603
    assert "could not append" in outcome["message"]
    assert "Permission denied" in outcome["message"]
    assert trace.read_bytes() == before
