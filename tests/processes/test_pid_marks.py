"""Pid marks: which counter a process started after a look took pids after
(capsuled.processes.pid_marks, docs/design.md §5)."""

from __future__ import annotations

import math
import time

from capsule_client.kit.proc import ticks_per_s
from capsuled.processes.pid_marks import MARK_MARGIN_S, MARK_SPACING_S, PidMarks

TICKS = ticks_per_s()


def now_ticks() -> int:
    return math.floor(time.clock_gettime(time.CLOCK_BOOTTIME) * TICKS)


def test_a_process_started_past_the_margin_after_a_mark_is_probed_from_its_counter() -> None:
    marks = PidMarks(TICKS)
    marks.mark(1000)
    later = now_ticks() + round((MARK_MARGIN_S + 0.5) * TICKS)
    assert marks.before(later, most=100) == 1000
    assert marks.before(now_ticks(), most=100) is None  # within the margin: it may be older
    assert marks.before(now_ticks() - TICKS, most=100) is None  # before the mark


def test_the_span_back_to_a_mark_counts_the_pids_handed_out_since() -> None:
    marks = PidMarks(TICKS)
    marks.mark(1000)
    later = now_ticks() + round((MARK_MARGIN_S + 0.5) * TICKS)
    marks.handed_out(60)
    assert marks.before(later, most=100) == 1000
    marks.handed_out(60)  # 120 since the mark, whatever the counter reads now
    assert marks.before(later, most=100) is None
    marks.clear()
    assert marks.before(later, most=1_000) is None


def test_marks_closer_than_the_spacing_keep_the_older_one() -> None:
    marks = PidMarks(TICKS)
    marks.mark(1000)
    marks.mark(2000)  # within MARK_SPACING_S of the first: not kept
    later = now_ticks() + round((MARK_MARGIN_S + MARK_SPACING_S + 0.5) * TICKS)
    assert marks.before(later, most=10_000) == 1000
