"""Pid marks: after which pid counter a process started since a moment has its pids
(docs/design.md §5, descendants).

Pids are handed out in order from one counter (``/proc/loadavg``'s last
field), wrapping at ``pid_max``. A *mark* is a look's counter and when it
was read (clock ticks since boot, read after the counter): a process that
started later, and everything it started, took pids after that counter.
:class:`PidMarks` keeps :data:`MARKS_KEPT` marks, one per
:data:`MARK_SPACING_S` at most, and counts the pids the probing looks saw
handed out between them, so the span back to a mark is exact whatever the
counter wrapped. The descendants tracker asks it where to probe from for a
new root that started before its last look.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Final

__all__ = ["MARKS_KEPT", "MARK_MARGIN_S", "MARK_SPACING_S", "PidMarks"]

#: Marks kept, one per ``MARK_SPACING_S`` at most: about the last 8 s of looks.
MARKS_KEPT: Final = 32
MARK_SPACING_S: Final = 0.25
#: A process must have started this long after a mark to be probed from it, seconds
#: (start times count whole clock ticks, 10 ms, and are read apart from the mark).
MARK_MARGIN_S: Final = 0.1

#: The clock of a process's start ticks (``/proc/<pid>/stat``), where there is one:
#: since boot, suspends included (``CLOCK_BOOTTIME`` is never behind the kernel's count).
_BOOTTIME: Final[int | None] = getattr(time, "CLOCK_BOOTTIME", None)


class PidMarks:
    """The recent looks' pid counters, and the pids handed out between them.

    Args:
        ticks_per_s: the clock ticks of a start time per second (``SC_CLK_TCK``).
    """

    def __init__(self, ticks_per_s: int) -> None:
        self._ticks_per_s = ticks_per_s
        self._handed_out = 0  # pids the probing looks counted since the last clear
        # (ticks since boot read after the counter, the counter, _handed_out then)
        self._marks: deque[tuple[int, int, int]] = deque(maxlen=MARKS_KEPT)

    def handed_out(self, pids: int) -> None:
        """A probing look saw ``pids`` pids handed out since the look before it."""
        self._handed_out += pids

    def mark(self, counter: int) -> None:
        """Keep ``counter`` (read before this call) with the time now, unless the latest
        mark is younger than :data:`MARK_SPACING_S`; nothing where there is no such clock."""
        if _BOOTTIME is None:
            return
        now = math.ceil(time.clock_gettime(_BOOTTIME) * self._ticks_per_s)
        if not self._marks or now - self._marks[-1][0] >= MARK_SPACING_S * self._ticks_per_s:
            self._marks.append((now, counter, self._handed_out))

    def clear(self) -> None:
        """Forget every mark (a full table was taken: the spans start again from it)."""
        self._marks.clear()

    def before(self, start_ticks: int, *, most: int) -> int | None:
        """The counter of the latest mark a process started at ``start_ticks`` started after
        (by :data:`MARK_MARGIN_S`): every pid it and its descendants took is after it. None
        when it started before every mark, or that mark is more than ``most`` pids back."""
        before = start_ticks - round(MARK_MARGIN_S * self._ticks_per_s)
        for ticks, counter, handed_out in reversed(self._marks):
            if ticks < before:
                return counter if self._handed_out - handed_out <= most else None
        return None
