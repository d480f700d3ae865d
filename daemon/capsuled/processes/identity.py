"""Which process is which: a start that no clock step moves (docs/design.md §14).

A process is named by its pid and its start, and the kernel says when a
process started in two ways:

* its *start ticks*, field 22 of ``/proc/<pid>/stat``: clock ticks since
  boot, which no step of the wall clock moves. With this boot's id
  (``/proc/sys/kernel/random/boot_id``, new at every boot) they are the
  kernel's exact identity of a process: (boot id, start ticks);
* its wall-clock start, Unix seconds: ``btime + start ticks / CLK_TCK``. The
  kernel derives ``btime`` from the wall clock each time ``/proc/stat`` is
  read, so an NTP step, ``date -s`` or a resumed VM moves every start
  computed after it by the step.

:class:`Start` carries both, as one read of the OS gave them. The daemon
names processes by the ticks wherever it has them (:meth:`Start.same`: the
exit watch's re-check, the descendants, terminate's last check before a
signal, the argv cache), so a step while it runs makes no process look new or
gone. A receipt's or a store row's claim is compared exactly where both sides
have (boot id, ticks), and within its wall-clock tolerance only where one side
lacks them (:func:`claim_matches`: an older writer, another platform).

**The one seam.** The daemon reads the boot time only through
:func:`boot_time_s`, and converts ticks to seconds only through :class:`Clock`,
which calls it. A test shows that a clock step changes no identity by moving
the boot time the daemon reads, never the machine's clock: in-process, it
swaps this module's :func:`boot_time_s` (pytest's ``monkeypatch.setattr``); a
real daemon it starts in a mount namespace of its own, with a file it writes
bind-mounted over ``/proc/stat`` (tests/integration/identity/).
"""

from __future__ import annotations

from typing import NamedTuple

from capsule_client.kit import proc

__all__ = ["Clock", "Start", "boot_time_s", "claim_matches", "this_boot_id"]


def boot_time_s() -> int:
    """The boot time, whole Unix seconds: ``btime`` from ``/proc/stat``, read afresh.

    The one place the daemon reads it (through :class:`Clock`), and so the
    seam by which tests move it as a clock step would (module docstring).

    Raises:
        OSError: ``/proc/stat`` could not be read or has no ``btime`` line.
    """
    return proc.boot_time_s()


def this_boot_id() -> str | None:
    """This boot's id, read once (:func:`capsule_client.kit.proc.boot_id`); None where
    the OS has none: claims are then compared by their start times alone."""
    return proc.boot_id()


class Clock:
    """Converts start ticks to Unix seconds (boot time + ticks / ``SC_CLK_TCK``).

    Reads the boot time once, when made (:func:`boot_time_s`): make one per
    sample or look, since ``btime`` moves with the clock.

    Raises:
        OSError: the boot time could not be read.
    """

    def __init__(self) -> None:
        self.boot_time_s = boot_time_s()
        self.ticks_per_s = proc.ticks_per_s()

    def seconds(self, start_ticks: int) -> float:
        """The start time in Unix seconds."""
        return self.boot_time_s + start_ticks / self.ticks_per_s

    def start(self, start_ticks: int) -> Start:
        """The :class:`Start` of a process that started at ``start_ticks``."""
        return Start(self.boot_time_s + start_ticks / self.ticks_per_s, start_ticks)


class Start(NamedTuple):
    """When a process started, as one read of the OS said it.

    Two starts of one pid are the same process when their ticks are equal
    (:meth:`same`); ``s`` is what people are shown and what a claim without
    ticks is compared with.
    """

    #: The wall-clock start, Unix seconds, as computed when read (it moves with the clock).
    s: float
    #: Clock ticks since boot (``/proc/<pid>/stat`` field 22); None where the
    #: OS does not count them (psutil's sample off Linux).
    ticks: int | None = None

    @property
    def key(self) -> int | float:
        """What names the process for good: its ticks, else its start time."""
        return self.s if self.ticks is None else self.ticks

    def same(self, other: Start, tolerance_s: float) -> bool:
        """Whether ``other``, read of the same pid, is the same process: equal ticks, or
        where either lacks them, start times within ``tolerance_s``."""
        if self.ticks is not None and other.ticks is not None:
            return self.ticks == other.ticks
        return abs(self.s - other.s) <= tolerance_s


def claim_matches(
    start: Start,
    started_at_s: float,
    tolerance_s: float,
    boot_id: str | None = None,
    start_ticks: int | None = None,
) -> bool:
    """Whether a receipt's or a row's claim names the process that started at ``start``.

    Exact where both sides have the identity: the claim's boot is this one and
    its ticks are ``start``'s — another boot id is another process, whatever the
    times say (a reboot can hand out the pid and even the ticks again). Where
    either side lacks it (an older writer, no ``/proc``): the start times
    within ``tolerance_s`` (docs/design.md §3 "Liveness", §14).
    """
    if boot_id is not None and start_ticks is not None and start.ticks is not None:
        this_boot = this_boot_id()
        if this_boot is not None:
            return boot_id == this_boot and start_ticks == start.ticks
    return abs(start.s - started_at_s) <= tolerance_s
