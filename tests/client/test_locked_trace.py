"""``capsule_client.kit.trace.locked_trace``: a writer that reads the trace before it
appends holds the trace's lock throughout, so no other writer comes in between
(docs/design.md §6, §12)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from capsule_client.kit.trace import (
    SessionStart,
    append_event,
    append_locked,
    encode_line,
    locked_trace,
    new_event_id,
    now_ms,
)


def start(session: str = "ses_locked") -> SessionStart:
    return SessionStart(new_event_id(), session, now_ms())


def test_another_writer_waits_for_the_lock_and_the_block_reads_what_is_there(
    tmp_path: Path,
) -> None:
    first = start()
    append_event(tmp_path, first)

    with locked_trace(tmp_path, "ses_locked", lock_timeout_s=1.0) as fd:
        assert os.pread(fd, 1 << 16, 0) == encode_line(first)
        with pytest.raises(TimeoutError):
            append_event(tmp_path, start(), lock_timeout_s=0.05)
        second = start()
        append_locked(fd, encode_line(second), fsync=False)

    third = start()
    append_event(tmp_path, third, lock_timeout_s=0.05)  # released at the block's end
    trace = (tmp_path / "ses_locked" / "trace.jsonl").read_bytes()
    assert trace == b"".join(encode_line(e) for e in (first, second, third))


@pytest.mark.parametrize("name", ["../escape", "not_a_session", "ses_a/b"])
def test_a_name_that_is_not_a_session_directory_opens_nothing(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="not a session directory name"):
        with locked_trace(tmp_path, name):
            pass
    assert list(tmp_path.iterdir()) == []
