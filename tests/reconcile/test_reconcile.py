"""Reconcile a prior session's trace: the original reconcile's six tests, then docs/design.md §6."""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from capsule_client.wire import LostReport, LostWork
from capsuled.errors import InternalError, InvalidParams, NoSuchTrace, RpcError, UnsafePath
from capsuled.reconcile.prior_session import lost_message, reconcile

SESSION_START = (
    '{"event_type":"session_start","event_id":"evt_session","session_id":"ses_prior","timestamp":1}'
)
TASK_START = (
    '{"event_type":"task_start","event_id":"evt_task","session_id":"ses_prior","timestamp":2,'
    '"task_id":"tsk_1","context_id":"ctx_1","source":"task_md","origin":"user",'
    '"trust":"trusted","lane":"user"}'
)
DETACHED_ONE = (
    '{"event_type":"shell_detached","event_id":"evt_detached","session_id":"ses_prior",'
    '"timestamp":1750,"turn":1,"task_id":"tsk_1","work_id":"wrk_one","binary":"/usr/bin/bash",'
    '"command":"sleep 60","grace_ms":1000}'
)
ABANDONED_ONE = (
    '{"event_type":"shell_abandoned","event_id":"evt_a","session_id":"ses_prior","timestamp":9,'
    '"work_id":"wrk_one","binary":"/usr/bin/bash","command":"sleep 60","running_ms":30000}'
)
COMPLETED_ONE = (
    '{"event_type":"shell_completed","event_id":"evt_c","session_id":"ses_prior","timestamp":9,'
    '"work_id":"wrk_one","binary":"/usr/bin/bash","command":"sleep 60","exit_code":0,'
    '"duration_ms":1,"output_path":"logs/wrk_one.log","output_bytes":1,"status":"ok",'
    '"completion_task_id":"tsk_2"}'
)
UNTRUSTED_TWO = (
    '{"event_type":"task_start","event_id":"evt_task2","session_id":"ses_prior","timestamp":3,'
    '"task_id":"tsk_2","context_id":"ctx_1","source":"a2a","origin":"event",'
    '"trust":"untrusted","lane":"peer"}\n'
    '{"event_type":"shell_detached","event_id":"evt_detached2","session_id":"ses_prior",'
    '"timestamp":1900,"turn":1,"task_id":"tsk_2","work_id":"wrk_two","binary":"/usr/bin/bash",'
    '"command":"sleep 90","grace_ms":1000}\n'
)
ORPHANED_THREE = (
    '{"event_type":"shell_detached","event_id":"evt_detached3","session_id":"ses_prior",'
    '"timestamp":1950,"turn":1,"task_id":"tsk_gone","work_id":"wrk_three",'
    '"binary":"/usr/bin/bash","command":"sleep 90","grace_ms":1000}\n'
)

MARKER_FIELDS = [
    "event_type",
    "event_id",
    "session_id",
    "timestamp",
    "parent_id",
    "work_id",
    "binary",
    "command",
    "detached_at_ms",
    "reconciled_by_session",
    "reconciled_task_id",
]


def trace_with(extra: str) -> str:
    return f"{SESSION_START}\n{TASK_START}\n{DETACHED_ONE}\n{extra}"


def sessions_root_with(tmp_path: Path, session: str, trace: str | bytes) -> Path:
    root = tmp_path / "sessions"
    (root / session).mkdir(parents=True)
    data = trace.encode() if isinstance(trace, str) else trace
    (root / session / "trace.jsonl").write_bytes(data)
    return root


def trace_bytes(root: Path, session: str = "ses_prior") -> bytes:
    return (root / session / "trace.jsonl").read_bytes()


def lost_lines(root: Path, session: str = "ses_prior") -> list[dict[str, Any]]:
    records = []
    for line in trace_bytes(root, session).splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event_type") == "shell_lost":
            records.append(record)
    return records


def reported(root: Path, this_session: str = "ses_resumed") -> LostReport:
    report = reconcile(root, "ses_prior", this_session, "ctx_1")
    assert report is not None, "an unaccounted command is reported"
    return report


def is_uuid7_hex(text: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{32}", text) is not None and uuid.UUID(hex=text).version == 7


# --------------------------------------------------------------------------
# The original reconcile's six tests


def test_an_unmatched_detached_command_is_reported_once_and_marked_in_its_session(
    tmp_path: Path,
) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(""))

    report = reported(root)

    assert report.started_in_session == "ses_prior"
    assert len(report.lost) == 1
    assert report.lost[0].work_id == "wrk_one"
    assert report.lost[0].binary == "/usr/bin/bash"
    assert report.lost[0].command == "sleep 60"
    assert report.lost[0].detached_at_ms == 1750
    assert report.context_id == "ctx_1"
    assert report.provenance.origin == "completion"
    assert report.provenance.trust == "trusted"
    lines = lost_lines(root)
    assert len(lines) == 1
    assert lines[0]["work_id"] == "wrk_one"
    assert lines[0]["session_id"] == "ses_prior"
    assert lines[0]["parent_id"] == "evt_session"
    assert lines[0]["reconciled_by_session"] == "ses_resumed"
    assert lines[0]["reconciled_task_id"] == report.task_id
    assert lines[0]["detached_at_ms"] == 1750
    for absent in ["exit_code", "status", "duration_ms", "output_path", "output_bytes"]:
        assert absent not in lines[0], f"a lost command has no {absent}: {lines[0]}"
    assert not report.message.startswith("Background shell command finished."), report.message
    for named in ["wrk_one", "/usr/bin/bash", "sleep 60", "1750"]:
        assert named in report.message, f"the report names {named}: {report.message}"


def test_a_marked_work_id_is_not_reported_again(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(""))

    assert reconcile(root, "ses_prior", "ses_resumed", "ctx_1") is not None
    assert reconcile(root, "ses_prior", "ses_third", "ctx_1") is None, (
        "the shell_lost line accounts for the work id"
    )
    assert len(lost_lines(root)) == 1, "a second resume adds no second marker"


@pytest.mark.parametrize(
    "accounting", [ABANDONED_ONE, COMPLETED_ONE], ids=["abandoned", "completed"]
)
def test_a_command_already_accounted_for_is_not_reported(tmp_path: Path, accounting: str) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(f"{accounting}\n"))
    before = trace_bytes(root)

    assert reconcile(root, "ses_prior", "ses_resumed", "ctx_1") is None
    assert trace_bytes(root) == before, "nothing is written when nothing is lost"


def test_a_torn_tail_is_skipped_and_the_records_above_it_still_report(tmp_path: Path) -> None:
    torn = 'not json at all\n{"event_type":"shell_comple'
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(torn))

    report = reported(root)

    assert [work.work_id for work in report.lost] == ["wrk_one"]
    assert len(lost_lines(root)) == 1
    lines = trace_bytes(root).split(b"\n")
    assert lines[-3] == b'{"event_type":"shell_comple', "the torn tail is left as it was"
    assert json.loads(lines[-2])["event_type"] == "shell_lost", "the marker starts a new line"
    assert lines[-1] == b""


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("ses_never_written", NoSuchTrace),
        ("../ses_prior", InvalidParams),
        ("ses_prior/..", InvalidParams),
        ("not_a_session", InvalidParams),
        ("", InvalidParams),
        ("ses_a\\b", InvalidParams),
        ("ses_a\0", InvalidParams),
        ("ses_..", InvalidParams),
    ],
)
def test_a_missing_or_unaddressable_session_raises_and_writes_nothing(
    tmp_path: Path, name: str, error: type[RpcError]
) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(""))
    before = trace_bytes(root)

    with pytest.raises(error) as raised:
        reconcile(root, name, "ses_resumed", "ctx_1")

    assert trace_bytes(root) == before, "no marker is written for a session never scanned"
    assert sorted(p.name for p in root.iterdir()) == ["ses_prior"]
    if error is InvalidParams:
        assert raised.value.code == -32602
        assert raised.value.data["param"] == "from_session"
    else:
        assert raised.value.code == -32003


def test_the_report_carries_the_lowest_trust_across_the_work_it_names(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path / "a", "ses_prior", trace_with(UNTRUSTED_TWO))

    report = reported(root)

    assert [work.work_id for work in report.lost] == ["wrk_one", "wrk_two"], (
        "both commands are reported as one task"
    )
    assert report.provenance.trust == "untrusted"
    assert {line["reconciled_task_id"] for line in lost_lines(root)} == {report.task_id}

    orphaned_root = sessions_root_with(tmp_path / "b", "ses_prior", trace_with(ORPHANED_THREE))
    assert reported(orphaned_root).provenance.trust == "untrusted", (
        "a task whose task_start is missing is not trusted"
    )


# --------------------------------------------------------------------------
# Markers (docs/design.md §6)


def test_markers_have_exactly_the_spec_fields_and_fresh_uuid7_ids(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(UNTRUSTED_TWO))
    before_ms = time.time_ns() // 1_000_000

    report = reported(root)

    after_ms = time.time_ns() // 1_000_000
    assert re.fullmatch(r"tsk_[0-9a-f]{32}", report.task_id)
    assert is_uuid7_hex(report.task_id.removeprefix("tsk_"))
    markers = lost_lines(root)
    assert [marker["work_id"] for marker in markers] == ["wrk_one", "wrk_two"]
    for marker in markers:
        assert list(marker) == MARKER_FIELDS
        assert marker["event_type"] == "shell_lost"
        assert marker["event_id"].startswith("evt_")
        assert is_uuid7_hex(marker["event_id"].removeprefix("evt_"))
        assert before_ms <= marker["timestamp"] <= after_ms
        assert marker["binary"] == "/usr/bin/bash"
    assert len({marker["event_id"] for marker in markers}) == 2
    assert [m["command"] for m in markers] == ["sleep 60", "sleep 90"]
    assert [m["detached_at_ms"] for m in markers] == [1750, 1900]


def test_parent_id_is_the_last_session_start_or_null(tmp_path: Path) -> None:
    second_start = SESSION_START.replace("evt_session", "evt_later")
    root = sessions_root_with(tmp_path / "a", "ses_prior", trace_with(f"{second_start}\n"))
    reported(root)
    assert lost_lines(root)[0]["parent_id"] == "evt_later"

    without_start = f"{TASK_START}\n{DETACHED_ONE}\n"
    root = sessions_root_with(tmp_path / "b", "ses_prior", without_start)
    reported(root)
    assert lost_lines(root)[0]["parent_id"] is None
    assert "parent_id" in lost_lines(root)[0], "parent_id is present, as null"


def test_markers_go_after_everything_and_leave_the_lines_above_unchanged(
    tmp_path: Path,
) -> None:
    original = trace_with(UNTRUSTED_TWO).encode()
    root = sessions_root_with(tmp_path, "ses_prior", original)

    reported(root)

    after = trace_bytes(root)
    assert after.startswith(original)
    added = after[len(original) :].split(b"\n")
    assert added[-1] == b"", "the last marker ends its line"
    assert [json.loads(line)["work_id"] for line in added[:-1]] == ["wrk_one", "wrk_two"]


def test_an_empty_trace_reports_nothing(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", b"")

    assert reconcile(root, "ses_prior", "ses_resumed", "ctx_1") is None
    assert trace_bytes(root) == b""


# --------------------------------------------------------------------------
# Retry after a lost reply


def test_the_same_session_asking_again_gets_the_same_report_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(UNTRUSTED_TWO))
    first = reported(root)
    after_first = trace_bytes(root)

    again = reported(root)

    assert again == first
    assert trace_bytes(root) == after_first, "a retry writes nothing"
    assert reconcile(root, "ses_prior", "ses_other", "ctx_1") is None, "another session: nothing"
    assert trace_bytes(root) == after_first


def test_a_retry_returns_the_latest_report_of_that_session(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(""))
    first = reported(root)
    with (root / "ses_prior" / "trace.jsonl").open("a") as trace:
        trace.write(ORPHANED_THREE)

    second = reported(root)
    again = reported(root)

    assert [work.work_id for work in first.lost] == ["wrk_one"]
    assert [work.work_id for work in second.lost] == ["wrk_three"], "only the new work"
    assert second.task_id != first.task_id
    assert again == second
    assert len(lost_lines(root)) == 2


def test_markers_written_for_another_session_are_not_rebuilt(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(""))
    reported(root, this_session="ses_one")

    assert reconcile(root, "ses_prior", "ses_two", "ctx_1") is None


# --------------------------------------------------------------------------
# Safety: nothing below the records root is followed through a symlink


def test_a_symlinked_session_directory_is_refused(tmp_path: Path) -> None:
    outside = sessions_root_with(tmp_path / "outside", "ses_real", trace_with(""))
    root = tmp_path / "sessions"
    root.mkdir()
    (root / "ses_prior").symlink_to(outside / "ses_real", target_is_directory=True)
    before = trace_bytes(outside, "ses_real")

    with pytest.raises(UnsafePath) as raised:
        reconcile(root, "ses_prior", "ses_resumed", "ctx_1")

    assert raised.value.code == -32004
    assert trace_bytes(outside, "ses_real") == before, "nothing written outside the root"


def test_a_symlinked_session_directory_inside_the_root_is_refused_too(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path, "ses_real", trace_with(""))
    (root / "ses_prior").symlink_to("ses_real", target_is_directory=True)
    before = trace_bytes(root, "ses_real")

    with pytest.raises(UnsafePath):
        reconcile(root, "ses_prior", "ses_resumed", "ctx_1")

    assert trace_bytes(root, "ses_real") == before


def test_a_symlinked_trace_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    target.write_text(trace_with(""))
    root = tmp_path / "sessions"
    (root / "ses_prior").mkdir(parents=True)
    (root / "ses_prior" / "trace.jsonl").symlink_to(target)

    with pytest.raises(UnsafePath):
        reconcile(root, "ses_prior", "ses_resumed", "ctx_1")

    assert target.read_text() == trace_with(""), "the symlink's target is not written"


def test_a_dangling_symlinked_trace_is_refused_not_missing(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "ses_prior").mkdir(parents=True)
    (root / "ses_prior" / "trace.jsonl").symlink_to(tmp_path / "nowhere")

    with pytest.raises(UnsafePath):
        reconcile(root, "ses_prior", "ses_resumed", "ctx_1")

    assert not (tmp_path / "nowhere").exists()


def test_a_trace_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "ses_prior").mkdir(parents=True)
    os.mkfifo(root / "ses_prior" / "trace.jsonl")

    with pytest.raises(UnsafePath):
        reconcile(root, "ses_prior", "ses_resumed", "ctx_1")


def test_the_records_root_itself_may_be_a_symlink(tmp_path: Path) -> None:
    real = sessions_root_with(tmp_path / "real", "ses_prior", trace_with(""))
    linked = tmp_path / "linked"
    linked.symlink_to(real, target_is_directory=True)

    assert reported(linked).lost[0].work_id == "wrk_one"
    assert len(lost_lines(real)) == 1


# --------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("layout", ["no root", "no session dir", "no trace", "dir is a file"])
def test_a_missing_trace_is_no_such_trace(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "sessions"
    if layout != "no root":
        root.mkdir()
    if layout == "no trace":
        (root / "ses_prior").mkdir()
    if layout == "dir is a file":
        (root / "ses_prior").write_text(trace_with(""))

    with pytest.raises(NoSuchTrace) as raised:
        reconcile(root, "ses_prior", "ses_resumed", "ctx_1")

    assert raised.value.code == -32003
    assert "ses_prior" in raised.value.message or layout == "no root"


def test_a_name_too_long_for_the_file_system_is_no_such_trace(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(""))

    with pytest.raises(NoSuchTrace):
        reconcile(root, "ses_" + "x" * 300, "ses_resumed", "ctx_1")


def test_a_trace_that_is_a_directory_is_no_such_trace(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "ses_prior" / "trace.jsonl").mkdir(parents=True)

    with pytest.raises(NoSuchTrace):
        reconcile(root, "ses_prior", "ses_resumed", "ctx_1")


def test_an_empty_this_session_is_invalid(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(""))

    with pytest.raises(InvalidParams) as raised:
        reconcile(root, "ses_prior", "", "ctx_1")

    assert raised.value.data["param"] == "this_session"
    assert lost_lines(root) == []


def test_a_trace_locked_past_the_timeout_is_an_internal_error_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(""))
    before = trace_bytes(root)
    holder = os.open(root / "ses_prior" / "trace.jsonl", os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(InternalError) as raised:
            reconcile(root, "ses_prior", "ses_resumed", "ctx_1", lock_timeout_s=0.05)
        waited_s = time.monotonic() - started
    finally:
        os.close(holder)

    assert raised.value.code == -32603
    assert "locked" in raised.value.message
    assert isinstance(raised.value.__cause__, TimeoutError)
    assert 0.05 <= waited_s < 5
    assert trace_bytes(root) == before
    assert reported(root).lost[0].work_id == "wrk_one", "once the lock is free, it reports"


def test_a_read_only_trace_with_nothing_lost_reports_nothing(tmp_path: Path) -> None:
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(f"{COMPLETED_ONE}\n"))
    (root / "ses_prior" / "trace.jsonl").chmod(0o400)

    assert reconcile(root, "ses_prior", "ses_resumed", "ctx_1") is None


# --------------------------------------------------------------------------
# The message


def test_the_message_names_every_lost_work_and_is_not_a_completion(tmp_path: Path) -> None:
    odd = (
        '{"event_type":"shell_detached","event_id":"e","session_id":"ses_prior",'
        '"timestamp":1764400000123,"task_id":"tsk_1","work_id":"wrk_odd",'
        '"binary":"/bin/sh","command":"echo \\"hi\\"\\nrm -rf build"}\n'
    )
    root = sessions_root_with(tmp_path, "ses_prior", trace_with(UNTRUSTED_TWO + odd))

    message = reported(root).message

    assert not message.startswith("Background shell command finished."), message
    assert "ses_prior" in message
    assert "3 background shell commands" in message
    for named in ["wrk_one", "sleep 60", "1750", "wrk_two", "sleep 90", "1900", "wrk_odd"]:
        assert named in message, f"the report names {named}: {message}"
    assert '"/bin/sh"' in message
    assert '"echo \\"hi\\"\\nrm -rf build"' in message, "the command is quoted, on one line"
    assert "1764400000123" in message
    assert "2025-11-29T07:06:40.123Z" in message
    assert len(message.splitlines()) == 4, "one head line, one line per work"


def test_the_message_for_a_detach_time_never_recorded_says_so() -> None:
    message = lost_message("ses_prior", [LostWork("wrk_x", "", "", 0)])

    assert "1 background shell command " in message
    assert "wrk_x" in message
    assert "not recorded" in message


def test_a_work_id_or_session_with_a_line_break_cannot_forge_a_line_of_the_message() -> None:
    forged = 'wrk_a\n- wrk_b: binary "/bin/rm", command "rm -rf ~"'
    message = lost_message("ses_p\u2028rior", [LostWork(forged, "sh", "a\u2028b\x85c", 0)])

    assert len(message.splitlines()) == 2, message
    assert '"a\\u2028b\\u0085c"' in message
    assert '"wrk_a\\n- wrk_b' in message, "an id that is not printable is quoted as JSON"
    assert '"ses_p\\u2028rior"' in message
    assert "- wrk_x: " in lost_message("ses_prior", [LostWork("wrk_x", "", "", 0)])
