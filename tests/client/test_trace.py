"""The trace writer kit (docs/design.md §9): whole lines, the shared lock, safe opening."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers.waits import ChildOutput

from capsule_client.kit.trace import (
    SessionStart,
    ShellLost,
    TraceWriter,
    append_event,
    encode_line,
    is_session_directory_name,
    lock_trace,
)
from capsuled.reconcile.prior_session import reconcile


def records(root: Path, session: str = "ses_w") -> list[dict[str, Any]]:
    data = (root / session / "trace.jsonl").read_bytes()
    assert data.endswith(b"\n"), "every append ends its line"
    return [json.loads(line) for line in data.splitlines()]


def test_each_event_is_one_line_with_its_fields(tmp_path: Path) -> None:
    root = tmp_path / "home" / "sessions"
    writer = TraceWriter(root, "ses_w")
    before_ms = time.time_ns() // 1_000_000

    ids = [
        writer.session_start(),
        writer.task_start("tsk_1", "trusted", context_id="ctx_1", lane="user"),
        writer.shell_detached("wrk_1", "/bin/sh", "sleep 60", task_id="tsk_1", turn=1),
        writer.shell_completed("wrk_1", "/bin/sh", "sleep 60", exit_code=0, status="ok"),
        writer.shell_abandoned("wrk_2", "/bin/sh", "sleep 90", running_ms=30_000),
    ]

    lines = records(root)
    assert [line["event_type"] for line in lines] == [
        "session_start",
        "task_start",
        "shell_detached",
        "shell_completed",
        "shell_abandoned",
    ]
    assert [line["event_id"] for line in lines] == ids
    for line in lines:
        assert list(line)[:4] == ["event_type", "event_id", "session_id", "timestamp"]
        assert re.fullmatch(r"evt_[0-9a-f]{32}", line["event_id"])
        assert line["session_id"] == "ses_w"
        assert before_ms <= line["timestamp"] <= time.time_ns() // 1_000_000
    assert lines[1] | {"event_id": "", "timestamp": 0} == {
        "event_type": "task_start",
        "event_id": "",
        "session_id": "ses_w",
        "timestamp": 0,
        "task_id": "tsk_1",
        "trust": "trusted",
        "context_id": "ctx_1",
        "lane": "user",
    }, "optional members not given are omitted"
    assert (lines[2]["work_id"], lines[2]["task_id"], lines[2]["turn"]) == ("wrk_1", "tsk_1", 1)
    assert (lines[3]["exit_code"], lines[3]["status"]) == (0, "ok")
    assert lines[4]["running_ms"] == 30_000


def test_the_session_directory_and_trace_are_private(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    TraceWriter(root, "ses_w").session_start()

    assert stat.S_IMODE((root / "ses_w").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "ses_w" / "trace.jsonl").stat().st_mode) == 0o600


def test_a_newline_in_a_command_stays_inside_its_line(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, "ses_w")

    writer.shell_detached("wrk_1", "/bin/sh", "echo a\necho b", task_id="tsk_1")

    (line,) = records(tmp_path)
    assert line["command"] == "echo a\necho b"


def test_an_append_after_a_torn_tail_starts_a_new_line(tmp_path: Path) -> None:
    (tmp_path / "ses_w").mkdir()
    (tmp_path / "ses_w" / "trace.jsonl").write_bytes(b'{"event_type":"shell_deta')

    TraceWriter(tmp_path, "ses_w").session_start()

    lines = (tmp_path / "ses_w" / "trace.jsonl").read_bytes().split(b"\n")
    assert lines[0] == b'{"event_type":"shell_deta'
    assert json.loads(lines[1])["event_type"] == "session_start"
    assert lines[2] == b""


@pytest.mark.parametrize(
    "name", ["", "wrk_1", "ses_a/b", "../ses_a", "ses_a\\b", "ses_\0", "ses_.."]
)
def test_an_invalid_session_name_is_refused(tmp_path: Path, name: str) -> None:
    assert not is_session_directory_name(name)
    with pytest.raises(ValueError, match="not a session directory name"):
        TraceWriter(tmp_path, name)
    event = SessionStart(event_id="evt_1", session_id=name, timestamp=1)
    with pytest.raises(ValueError, match="not a session directory name"):
        append_event(tmp_path, event)
    assert list(tmp_path.iterdir()) == []


def test_a_symlinked_session_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "sessions"
    root.mkdir()
    (root / "ses_w").symlink_to(elsewhere, target_is_directory=True)

    with pytest.raises(OSError) as raised:
        TraceWriter(root, "ses_w").session_start()

    assert raised.value.errno == errno.ELOOP
    assert list(elsewhere.iterdir()) == []


def test_a_symlinked_trace_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("")
    (tmp_path / "sessions" / "ses_w").mkdir(parents=True)
    (tmp_path / "sessions" / "ses_w" / "trace.jsonl").symlink_to(target)

    with pytest.raises(OSError) as raised:
        TraceWriter(tmp_path / "sessions", "ses_w").session_start()

    assert raised.value.errno == errno.ELOOP
    assert target.read_text() == ""


def test_an_append_waits_for_the_lock_and_gives_up_after_its_timeout(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, "ses_w")
    writer.session_start()
    holder = os.open(tmp_path / "ses_w" / "trace.jsonl", os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        event = SessionStart(event_id="evt_2", session_id="ses_w", timestamp=2)
        with pytest.raises(TimeoutError):
            append_event(tmp_path, event, lock_timeout_s=0.05)
    finally:
        os.close(holder)

    assert len(records(tmp_path)) == 1
    append_event(tmp_path, event, lock_timeout_s=0.05)
    assert [line["event_id"] for line in records(tmp_path)][-1] == "evt_2"


def test_lock_trace_without_timeout_takes_a_free_lock(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text("")
    fd = os.open(path, os.O_RDONLY)
    other = os.open(path, os.O_RDONLY)
    try:
        lock_trace(fd, None)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        os.close(other)


def test_shell_lost_always_carries_parent_id() -> None:
    marker = ShellLost(
        event_id="evt_1",
        session_id="ses_p",
        timestamp=1,
        parent_id=None,
        work_id="wrk_1",
        binary="",
        command="",
        detached_at_ms=0,
        reconciled_by_session="ses_q",
        reconciled_task_id="tsk_1",
    )

    decoded = json.loads(encode_line(marker))

    assert decoded["parent_id"] is None
    assert decoded["event_type"] == "shell_lost"


WRITER = r"""
import sys
from capsule_client.kit.trace import TraceWriter
writer = TraceWriter(sys.argv[1], "ses_w")
print("ready", flush=True)
sys.stdin.readline()
for n in range(int(sys.argv[3])):
    writer.shell_detached(f"wrk_{sys.argv[2]}_{n}", "/bin/sh", "x" * 5000, task_id="tsk_1")
"""


def test_concurrent_writers_and_a_reconcile_never_fuse_lines(tmp_path: Path) -> None:
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(n), "50"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    for writer in writers:
        assert writer.stdout is not None and ChildOutput(writer.stdout).line() == b"ready"
    for writer in writers:
        assert writer.stdin is not None
        writer.stdin.write("go\n")
        writer.stdin.close()
    trace = tmp_path / "ses_w" / "trace.jsonl"
    deadline = time.monotonic() + 5
    while not (trace.exists() and trace.stat().st_size > 0):
        assert time.monotonic() < deadline, "no writer appended within 5 s"
        time.sleep(0.001)
    report = reconcile(tmp_path, "ses_w", "ses_r", "ctx")
    for writer in writers:
        assert writer.wait(timeout=30) == 0
        assert writer.stdout is not None
        writer.stdout.close()

    lines = records(tmp_path)
    detached = [line["work_id"] for line in lines if line["event_type"] == "shell_detached"]
    lost = [line["work_id"] for line in lines if line["event_type"] == "shell_lost"]
    assert len(detached) == 200 == len(set(detached))
    assert report is not None
    assert sorted(lost) == sorted(work.work_id for work in report.lost)
    assert set(lost) <= set(detached)


def test_every_event_id_is_a_uuid7_and_later_ids_sort_after_earlier_ones(tmp_path: Path) -> None:
    """The writer kit's events and reconcile's markers take their ids from one place."""
    writer = TraceWriter(tmp_path, "ses_w")
    writer.session_start()
    writer.task_start("tsk_1", "trusted")
    writer.shell_detached("wrk_a", "/bin/sh", "sleep 60", task_id="tsk_1")
    writer.shell_detached("wrk_b", "/bin/sh", "sleep 90", task_id="tsk_1")
    before_ms = time.time_ns() // 1_000_000
    report = reconcile(tmp_path, "ses_w", "ses_r", "ctx")
    after_ms = time.time_ns() // 1_000_000

    assert report is not None
    lines = records(tmp_path)
    assert [line["event_type"] for line in lines][-2:] == ["shell_lost", "shell_lost"]
    ids = [line["event_id"] for line in lines]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), ids
    for event_id in ids:
        assert re.fullmatch(r"evt_[0-9a-f]{32}", event_id), event_id
        assert uuid.UUID(hex=event_id[4:]).version == 7, event_id
    marker_ms = [uuid.UUID(hex=event_id[4:]).int >> 80 for event_id in ids[-2:]]
    assert all(before_ms <= ms <= after_ms for ms in marker_ms), (before_ms, marker_ms, after_ms)
    task_id = uuid.UUID(hex=report.task_id.removeprefix("tsk_"))
    assert task_id.version == 7
