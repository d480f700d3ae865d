"""The descendants tracker: what a session's processes start is the session's.

:class:`DescendantTracker` keeps, look after look, the descendants of the
sessions' processes (the roots): each process whose parent was a session
process at some look, or that is in a Unix session one leads or led.
:meth:`DescendantTracker.look` finds new ones in a full process table when
it is given one, else by probing the pids handed out since the last look
(from a kept mark of the pid counter for a root older than the last look,
:mod:`.pid_marks`) or by the kernel's children lists, and drops those that
exited (their pidfds polled at once, :mod:`.members`). Also offers
:class:`Descendant` (one process found), :class:`LookCost` (what a look
read) and the limits a look keeps to. docs/design.md §5 "Descendants" has
the rules, how often the daemon looks, and what escapes a look.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from capsule_client.kit.proc import ticks_per_s

from .members import ExitPoll, Member
from .pid_marks import PidMarks
from .table import Clock, ProcessTable, ProcStat, last_pid, proc_stat, take_table
from .table import thread_group_id as _tgid

__all__ = [
    "LOOK_INTERVAL_S",
    "MAX_PROBED_PIDS",
    "MAX_TRACKED_PIDFDS",
    "ROOT_TOLERANCE_S",
    "Descendant",
    "DescendantTracker",
    "LookCost",
    "children_files_supported",
]

#: Seconds between two looks while some session has a live process.
LOOK_INTERVAL_S: Final = 1.0
#: Pids handed out since the last look above which one full table is cheaper.
MAX_PROBED_PIDS: Final = 4096
#: Pidfds a tracker holds at most (past them, a look reads the stat of the rest).
MAX_TRACKED_PIDFDS: Final = 1024
#: A root without start ticks must match its stat within this (the widest receipt tolerance, §3).
ROOT_TOLERANCE_S: Final = 5.0

#: (pid, started_at Unix s) → session id: the live receipt and owned processes.
Roots = Mapping[tuple[int, int], str]
#: pid → start ticks of the roots, as the observation's sample read them.
RootTicks = Mapping[int, int]


@dataclass(frozen=True, slots=True)
class Descendant:
    """A process a session's process started (or that is in its Unix session).

    Attributes:
        pid: its pid.
        started_at: its start time, Unix seconds, rounded to the nearest second as the
            writer kit rounds a receipt's (so a child never reads as older than its parent);
            read when it was first seen and kept while it lives, so that a clock step
            does not make it look like another process (docs/design.md §14).
        parent_pid: its parent when first seen (kept after that parent exits).
        root_pid: the root (receipt or owned process) it descends from.
        session_id: the root's session.
    """

    pid: int
    started_at: int
    parent_pid: int
    root_pid: int
    session_id: str


@dataclass(frozen=True, slots=True)
class LookCost:
    """What one look read.

    Attributes:
        full: it walked a full process table (given, or taken for want of a cheaper way).
        stats: ``/proc/<pid>/stat`` files read (not counting a full table's).
        probed: pids handed out since the last look that it read (the counter strategy).
        children_lists: ``children`` files read (the children-files strategy).
    """

    full: bool = False
    stats: int = 0
    probed: int = 0
    children_lists: int = 0


def _same(stat: ProcStat | None, start_ticks: int) -> bool:
    """Whether ``stat`` is of a live process that started at ``start_ticks``."""
    return stat is not None and stat.live and stat.start_ticks == start_ticks


def children_files_supported() -> bool:
    """Whether this kernel has ``/proc/<pid>/task/<tid>/children`` (``CONFIG_PROC_CHILDREN``)."""
    return os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


class DescendantTracker:
    """Keeps the descendants of the session processes, look after look.

    Args:
        children_files: use the kernel's children lists between full tables;
            None decides by :func:`children_files_supported`.
        max_probed_pids: past this many new pids, a look takes a full table.
        max_pidfds: session processes held by a pidfd at most (their exits
            cost no read at a look); the rest are checked by their stat.

    Blocking (reads ``/proc``): run looks in a worker thread, one at a time.
    :meth:`close` lets the pidfds go (so does garbage collection).
    """

    def __init__(
        self,
        *,
        children_files: bool | None = None,
        max_probed_pids: int = MAX_PROBED_PIDS,
        max_pidfds: int = MAX_TRACKED_PIDFDS,
    ) -> None:
        self.children_files = (
            children_files_supported() if children_files is None else children_files
        )
        self.max_probed_pids = max_probed_pids
        self._pid_max = _pid_max()
        self._known: dict[int, Member] = {}
        # sid → the session process that led it: kept after the leader exits, while
        # the Unix session has members (its id cannot be handed out again until then).
        self._led: dict[int, Member] = {}
        self._last_pid: int | None = None
        self._marks = PidMarks(ticks_per_s())  # where to probe from for an older new root
        self._roots: dict[tuple[int, int], Member] = {}  # the live roots of the last look
        self._exits = ExitPoll(max_pidfds)
        self.last_cost = LookCost()
        #: A look without a table was given a root started before its probe range
        #: and every kept mark: what that root started earlier is found only in a
        #: full table.
        self.owes_table = False

    def close(self) -> None:
        """Let every pidfd go; the tracker forgets what it kept."""
        self._exits.close()
        self.forget()

    def __enter__(self) -> DescendantTracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def look(
        self,
        roots: Roots,
        table: ProcessTable | None = None,
        root_ticks: RootTicks | None = None,
    ) -> dict[tuple[int, int], Descendant]:
        """The descendants now: (pid, started_at) → :class:`Descendant`.

        Args:
            roots: (pid, started_at Unix s) → session id of the live receipt
                and owned processes.
            table: a full process table (an observation's); without it the
                look reads only the session's processes and what is new.
            root_ticks: pid → start ticks of the roots as the observation's
                sample read them: a root whose stat has other ticks counts as
                gone. A root without them counts as gone when its stat's start
                time is not within :data:`ROOT_TOLERANCE_S` of its ``started_at``.
        """
        clock = Clock()
        full = table is not None
        older: list[int] = []  # new roots started before the probe range
        if table is None and not self.children_files:
            counter = last_pid()
            if (
                counter is None
                or self._last_pid is None
                or self._span(self._last_pid, counter) > self.max_probed_pids
            ):
                table, full = take_table(), True
            elif any(key not in self._roots for key in roots):
                new_pids = self._pids_after(self._last_pid, counter)
                older = [
                    key[0] for key in roots if key not in self._roots and key[0] not in new_pids
                ]
        if full:
            self.owes_table = False
        members, stats = self._members(
            roots, root_ticks or {}, clock, None if table is None else table.stats
        )
        probed = lists = 0
        if table is not None:
            self._last_pid = table.last_pid
            self._marks.clear()  # a root started before this table needs another one
            self._grow(members, table.stats, clock, check_threads=False)
            # A Unix session ends with its last member; its id is then free for reuse.
            sids = {stat.session_id for stat in table.stats.values()}
            self._led = {sid: m for sid, m in self._led.items() if sid in sids}
        elif self.children_files:
            lists, read = self._grow_by_children(members, clock)
            stats += read
        else:
            probed = self._grow_by_probe(members, self._probe_from(members, older), clock)
        if not self.children_files and self._last_pid is not None:
            self._marks.mark(self._last_pid)  # the children lists keep no counter
        stats += self._exits.sync(members)
        self._known = {pid: m for pid, m in members.items() if m.parent_pid}
        self._roots = {key: members[key[0]] for key in roots if key[0] in members}
        self.last_cost = LookCost(
            full=full, stats=stats + probed, probed=probed, children_lists=lists
        )
        found = {}
        for pid, member in sorted(self._known.items()):
            found[pid, member.started_at] = Descendant(
                pid, member.started_at, member.parent_pid, member.root_pid, member.session_id
            )
        return found

    def forget(self) -> None:
        """Drop every descendant (the daemon's home was replaced, say)."""
        self._known.clear()
        self._led.clear()
        self._roots.clear()

    # ------------------------------------------------------------------

    def _members(
        self,
        roots: Roots,
        root_ticks: RootTicks,
        clock: Clock,
        lookup: Mapping[int, ProcStat] | None,
    ) -> tuple[dict[int, Member], int]:
        """The live roots and the known descendants still running; stat files read."""
        members: dict[int, Member] = {}
        stats = 0

        def stat_of(pid: int) -> ProcStat | None:
            nonlocal stats
            if lookup is not None:
                return lookup.get(pid)
            stats += 1
            return proc_stat(pid)

        exited = self._exits.exited() if lookup is None else set()

        def held(pid: int, member: Member | None) -> bool:
            """Held by a pidfd that has not turned readable: still running, no read needed."""
            return (
                lookup is None
                and member is not None
                and self._exits.holds(pid, member.start_ticks)
                and pid not in exited
            )

        for key, session_id in sorted(roots.items()):
            pid, started_at = key
            last = self._roots.get(key)
            if last is not None and held(pid, last):
                same = last.session_id == session_id
                members[pid] = last if same else dataclasses.replace(last, session_id=session_id)
                continue
            stat = stat_of(pid)
            if stat is None or not stat.live:
                continue
            ticks = root_ticks.get(pid)
            if (
                stat.start_ticks == ticks
                if ticks is not None
                else abs(clock.seconds(stat.start_ticks) - started_at) <= ROOT_TOLERANCE_S
            ):
                members[pid] = Member(
                    stat.start_ticks, stat.session_id, session_id, pid, 0, started_at
                )
        for pid, known in self._known.items():
            if pid in members or pid in exited:
                continue  # a root itself now (listed once, as the closest attribution), or gone
            if held(pid, known) or _same(stat_of(pid), known.start_ticks):
                members[pid] = known
        return members, stats

    def _probe_from(self, members: Mapping[int, Member], older: list[int]) -> int:
        """The counter after which to probe: the last look's, or for new roots started
        before it the latest mark they all started after (owing a table if there is none)."""
        assert self._last_pid is not None
        starts = [members[pid].start_ticks for pid in older if pid in members]
        if not starts:
            return self._last_pid
        since = self._marks.before(min(starts), most=self.max_probed_pids)
        if since is None:
            self.owes_table = True  # started before every kept mark: only a table tells
            return self._last_pid
        return since

    def _grow_by_probe(self, members: dict[int, Member], since: int, clock: Clock) -> int:
        """Add what descends from ``members`` among the pids handed out after ``since``
        (the last look's counter, or an older mark's)."""
        counter = last_pid()
        if counter is None or self._last_pid is None:
            raise AssertionError("a probe needs the pid counter of two looks")
        candidates: dict[int, ProcStat] = {}
        probed = 0
        for pid in self._pids_after(since, counter):
            probed += 1
            stat = proc_stat(pid)
            if stat is not None and stat.live and pid not in members:
                candidates[pid] = stat
        self._marks.handed_out(self._span(self._last_pid, counter))
        self._last_pid = counter
        self._grow(members, candidates, clock, check_threads=True)
        return probed

    def _grow(
        self,
        members: dict[int, Member],
        stats: Mapping[int, ProcStat],
        clock: Clock,
        *,
        check_threads: bool,
    ) -> None:
        """Add the processes of ``stats`` that descend from ``members``, transitively: by
        their parent, or by a Unix session that a session process leads or led."""
        by_parent: defaultdict[int, list[int]] = defaultdict(list)
        by_sid: defaultdict[int, list[int]] = defaultdict(list)
        for pid, stat in stats.items():
            if pid not in members:
                by_parent[stat.ppid].append(pid)
                by_sid[stat.session_id].append(pid)
        for pid, member in members.items():
            if member.sid == pid:
                self._led[pid] = member
        pending: list[tuple[Member, list[int]]] = [
            (members[pid], by_parent.get(pid, [])) for pid in sorted(members)
        ]
        pending.extend((leader, by_sid.get(sid, [])) for sid, leader in sorted(self._led.items()))
        while pending:
            via, found = pending.pop()
            for pid in found:
                stat = stats[pid]
                if pid in members or stat.start_ticks < via.start_ticks:
                    continue  # known, or older than its claimed parent (a reused parent pid)
                if check_threads and _tgid(pid) != pid:
                    continue  # a thread: its stat names its process's parent
                member = members[pid] = Member(
                    stat.start_ticks,
                    stat.session_id,
                    via.session_id,
                    via.root_pid,
                    stat.ppid,
                    round(clock.seconds(stat.start_ticks)),
                )
                pending.append((member, by_parent.get(pid, [])))
                if stat.session_id == pid:  # it leads a Unix session (setsid): its members are ours
                    self._led[pid] = member
                    pending.append((member, by_sid.get(pid, [])))

    def _grow_by_children(self, members: dict[int, Member], clock: Clock) -> tuple[int, int]:
        """Add children found in the children lists of ``members``, transitively."""
        lists = read = 0
        queue = sorted(members)
        while queue:
            parent_pid = queue.pop()
            parent = members[parent_pid]
            children, files = _children(parent_pid)
            lists += files
            for child in children:
                if child in members:
                    continue
                stat = proc_stat(child)
                read += 1
                if stat is None or not stat.live or stat.start_ticks < parent.start_ticks:
                    continue
                members[child] = Member(
                    stat.start_ticks,
                    stat.session_id,
                    parent.session_id,
                    parent.root_pid,
                    parent_pid,
                    round(clock.seconds(stat.start_ticks)),
                )
                queue.append(child)
        return lists, read

    def _span(self, since: int, counter: int) -> int:
        """How many pids were handed out after ``since`` up to ``counter``."""
        if counter >= since:
            return counter - since
        return self._pid_max - since + counter  # the counter wrapped

    def _pids_after(self, since: int, counter: int) -> Iterable[int]:
        """The pids handed out after ``since`` up to ``counter``."""
        if counter >= since:
            return range(since + 1, counter + 1)
        return (*range(since + 1, self._pid_max), *range(2, counter + 1))


def _children(pid: int) -> tuple[list[int], int]:
    """The children of every thread of ``pid`` (``/proc/<pid>/task/<tid>/children``),
    and how many such files were read."""
    children: list[int] = []
    files = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children, files
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as file:
                data = file.read()
        except OSError:
            continue
        files += 1
        children.extend(int(child) for child in data.split())
    return children, files


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max", "rb") as file:
            return int(file.read())
    except (OSError, ValueError):
        return 1 << 22  # the kernel's upper bound
