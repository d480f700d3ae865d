"""The descendants tracker with real process trees (capsuled.processes.descendants)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from helpers.processes import DEADLINE_S, proc_state
from helpers.waits import wait_until

from capsuled.processes.descendants import (
    LOOK_INTERVAL_S,
    Descendant,
    DescendantTracker,
    children_files_supported,
)
from capsuled.processes.pid_marks import MARK_MARGIN_S
from capsuled.processes.table import Clock, proc_stat, take_table

SESSION = "ses_tree"


class Trees:
    """Real process trees; every process in them is killed afterwards."""

    def __init__(self) -> None:
        self.roots: list[subprocess.Popen[bytes]] = []
        self.pidfds: list[int] = []  # killed through pidfds: a reused pid is never hit

    def own(self, *pids: int) -> None:
        """Kill ``pids`` (processes of the trees, not children of the test) afterwards."""
        for pid in pids:
            try:
                self.pidfds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                continue

    def start(self, script: str, **kwargs: object) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(["sh", "-c", script], **kwargs)  # type: ignore[call-overload]
        self.roots.append(process)
        return process

    def close(self) -> None:
        for root in self.roots:
            if root.poll() is None:
                root.kill()
            root.wait(timeout=DEADLINE_S)
            for stream in (root.stdin, root.stdout):
                if stream is not None:
                    stream.close()
        for fd in self.pidfds:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                os.close(fd)


@pytest.fixture
def trees() -> Iterator[Trees]:
    pool = Trees()
    try:
        yield pool
    finally:
        pool.close()


def root_key(pid: int) -> tuple[int, int]:
    stat = proc_stat(pid)
    assert stat is not None
    return pid, round(Clock().seconds(stat.start_ticks))


def children_of(pid: int) -> list[int]:
    """The children of ``pid`` now, from a full table (the test's own reference)."""
    return sorted(p for p, stat in take_table().stats.items() if stat.ppid == pid)


def listed(found: dict[tuple[int, int], Descendant]) -> dict[int, tuple[int, int, str]]:
    """pid → (parent_pid, root_pid, session_id)."""
    return {d.pid: (d.parent_pid, d.root_pid, d.session_id) for d in found.values()}


def wait_for_children(trees: Trees, pid: int, count: int) -> list[int]:
    children = wait_until(
        lambda: (c := children_of(pid)) and len(c) == count and c,
        message=f"{count} children of {pid}",
    )
    trees.own(*children)
    return children


@pytest.mark.parametrize("children_files", [False, True])
def test_orphans_stay_listed_until_they_exit(trees: Trees, children_files: bool) -> None:
    if children_files and not children_files_supported():
        pytest.skip("this kernel has no /proc/<pid>/task/<tid>/children")
    shell = trees.start("sleep 300 & sleep 300 & wait")
    sleeps = wait_for_children(trees, shell.pid, 2)
    tracker = DescendantTracker(children_files=children_files)
    roots = {root_key(shell.pid): SESSION}
    assert listed(tracker.look(roots)) == {p: (shell.pid, shell.pid, SESSION) for p in sleeps}

    shell.kill()  # the sleeps are re-parented; they stay the session's
    shell.wait(timeout=DEADLINE_S)
    wait_until(lambda: all(proc_stat(p).ppid != shell.pid for p in sleeps), message="re-parented")  # type: ignore[union-attr]
    found = tracker.look({})
    assert listed(found) == {p: (shell.pid, shell.pid, SESSION) for p in sleeps}
    assert not tracker.last_cost.full or children_files

    os.kill(sleeps[0], signal.SIGKILL)
    wait_until(lambda: proc_state(sleeps[0]) in (None, "Z"), message="the first sleep gone")
    assert list(listed(tracker.look({}))) == [sleeps[1]]


def test_a_child_started_between_two_looks_is_found_by_the_pid_counter(trees: Trees) -> None:
    shell = trees.start(
        "while read line; do sleep 300 & echo $!; done",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert shell.stdin is not None and shell.stdout is not None
    tracker = DescendantTracker(children_files=False)
    roots = {root_key(shell.pid): SESSION}
    assert tracker.look(roots) == {} and tracker.last_cost.full  # the first look: a full table
    shell.stdin.write(b"go\n")
    shell.stdin.flush()
    child = int(shell.stdout.readline())
    trees.own(child)
    found = tracker.look(roots)
    assert listed(found) == {child: (shell.pid, shell.pid, SESSION)}
    cost = tracker.last_cost
    assert not cost.full and cost.probed >= 1
    # The new pids' stats and the child's, checked as its pidfd is opened; the root is held
    # by a pidfd since the first look and costs no read.
    assert cost.stats == 1 + cost.probed
    key = next(iter(found))
    assert key[0] == child and abs(key[1] - time.time()) < 10


def after_the_mark_margin() -> None:
    """Wait until a process started now starts past the margin after the latest look."""
    marked = time.clock_gettime(time.CLOCK_BOOTTIME)
    wait_until(
        lambda: time.clock_gettime(time.CLOCK_BOOTTIME) > marked + MARK_MARGIN_S + 0.05,
        message="the margin after the look",
    )


def hand_out_pids(count: int) -> None:
    for _ in range(count):
        subprocess.run(["true"], check=True)


def test_a_new_root_that_forked_before_the_last_look_is_probed_from_a_kept_mark(
    trees: Trees,
) -> None:
    tracker = DescendantTracker(children_files=False)
    assert tracker.look({}) == {} and tracker.last_cost.full  # the first look, a mark
    after_the_mark_margin()
    shell = trees.start("sleep 300 & wait")
    (child,) = wait_for_children(trees, shell.pid, 1)
    assert tracker.look({}) == {} and not tracker.last_cost.full  # its range passes the fork
    roots = {root_key(shell.pid): SESSION}  # the shell becomes a root only now
    assert listed(tracker.look(roots)) == {child: (shell.pid, shell.pid, SESSION)}
    assert not tracker.last_cost.full and not tracker.owes_table


def test_a_kept_mark_too_many_pids_back_owes_a_table_instead(trees: Trees) -> None:
    """A mark more pids back than the probe limit is not probed from (the span counts
    the pids each probing look saw handed out): the root owes a table."""
    limit = 64
    for _attempt in range(5):  # other processes fork too: a look past the limit is a table
        tracker = DescendantTracker(children_files=False, max_probed_pids=limit)
        assert tracker.look({}) == {} and tracker.last_cost.full
        after_the_mark_margin()
        # The shell starts before the probing looks: their marks are all later than
        # its start, so the first look's is the only one it started after, however
        # slowly the pids below are handed out.
        shell = trees.start("sleep 300 & wait")
        (child,) = wait_for_children(trees, shell.pid, 1)
        clean = True
        for _ in range(3):  # 90 pids and more since the mark, under the limit between looks
            hand_out_pids(30)
            tracker.look({})
            clean &= not tracker.last_cost.full
        if clean:
            break
    else:
        pytest.fail(f"more than {limit} pids were handed out between two looks, five times")
    roots = {root_key(shell.pid): SESSION}
    assert tracker.look(roots) == {} and tracker.owes_table
    found = tracker.look(roots, take_table())
    assert listed(found) == {child: (shell.pid, shell.pid, SESSION)}
    assert not tracker.owes_table


def test_threads_are_not_descendants(trees: Trees) -> None:
    script = (
        "import sys, threading, time\n"
        "for line in sys.stdin:\n"
        "    threading.Thread(target=time.sleep, args=(300,), daemon=True).start()\n"
        "    print(threading.get_native_id() and len(threading.enumerate()), flush=True)\n"
    )
    python = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    trees.roots.append(python)
    assert python.stdin is not None and python.stdout is not None
    tracker = DescendantTracker(children_files=False)
    roots = {root_key(python.pid): SESSION}
    tracker.look(roots)
    python.stdin.write(b"thread\n")
    python.stdin.flush()
    assert python.stdout.readline() == b"2\n"
    assert tracker.look(roots) == {}
    assert tracker.last_cost.probed >= 1  # the thread's id was read, and refused


def test_grandchildren_name_their_root(trees: Trees) -> None:
    shell = trees.start("sh -c 'sleep 300 & wait' & wait")
    (middle,) = wait_for_children(trees, shell.pid, 1)
    (grandchild,) = wait_for_children(trees, middle, 1)
    found = DescendantTracker(children_files=False).look({root_key(shell.pid): SESSION})
    assert listed(found) == {
        middle: (shell.pid, shell.pid, SESSION),
        grandchild: (middle, shell.pid, SESSION),
    }


def test_a_root_is_listed_as_a_root_not_as_a_descendant(trees: Trees) -> None:
    shell = trees.start("sleep 300 & sleep 300 & wait")
    first, second = wait_for_children(trees, shell.pid, 2)
    roots = {root_key(shell.pid): SESSION, root_key(first): "ses_other"}
    found = DescendantTracker(children_files=False).look(roots)
    assert listed(found) == {second: (shell.pid, shell.pid, SESSION)}


def double_fork(trees: Trees, script: str, **kwargs: object) -> tuple[int, int]:
    """Start ``script``, in which ``$DOUBLE_FORK`` starts a sleep that is re-parented at once;
    returns (the shell's pid, the sleep's pid)."""
    fork = "(sleep 300 & echo $!)"
    shell = trees.start(script.replace("$DOUBLE_FORK", fork), stdout=subprocess.PIPE, **kwargs)
    assert shell.stdout is not None
    orphan = int(shell.stdout.readline())
    trees.own(orphan)
    wait_until(lambda: proc_state(orphan) == "S", message=f"sleep {orphan} running")
    return shell.pid, orphan


def test_a_double_fork_in_a_session_the_root_leads_is_found_by_sid(trees: Trees) -> None:
    """The daemon-style double fork: the sleep is re-parented before any look."""
    shell, orphan = double_fork(trees, "$DOUBLE_FORK; exec sleep 300", start_new_session=True)
    table = take_table()
    assert table.stats[orphan].ppid != shell and table.stats[orphan].session_id == shell
    found = DescendantTracker(children_files=False).look({root_key(shell): SESSION}, table)
    assert listed(found) == {orphan: (table.stats[orphan].ppid, shell, SESSION)}


def test_a_setsid_grandchild_and_what_it_starts_are_found(trees: Trees) -> None:
    """Background work started with setsid: its Unix session marks everything in it."""
    shell, orphan = double_fork(trees, "setsid sh -c '$DOUBLE_FORK; exec sleep 300' & wait")
    (leader,) = wait_for_children(trees, shell, 1)
    table = take_table()
    assert (
        table.stats[leader].session_id == leader == table.stats[orphan].session_id
    )  # setsid: a new session
    found = DescendantTracker(children_files=False).look({root_key(shell): SESSION}, table)
    assert listed(found) == {
        leader: (shell, shell, SESSION),
        orphan: (table.stats[orphan].ppid, shell, SESSION),
    }


def test_a_double_fork_outside_a_led_session_escapes_as_documented(trees: Trees) -> None:
    shell, orphan = double_fork(trees, "$DOUBLE_FORK; exec sleep 300")
    table = take_table()
    assert table.stats[shell].session_id != shell  # the root does not lead its Unix session
    found = DescendantTracker(children_files=False).look({root_key(shell): SESSION}, table)
    assert found == {}  # re-parented before the first look, in no session a root leads
    assert orphan in table.stats


@pytest.mark.parametrize("max_pidfds", [1024, 0])
def test_a_quiet_look_at_a_hundred_processes_costs_little(trees: Trees, max_pidfds: int) -> None:
    """The descendants of one root, nothing forking in them: a look is cheap (docs/design.md §5).

    Held by pidfds, the 101 processes cost one poll; without pidfds, a stat read each.
    """
    shell = trees.start("for i in $(seq 100); do sleep 300 & done; wait")
    sleeps = wait_for_children(trees, shell.pid, 100)
    with DescendantTracker(children_files=False, max_pidfds=max_pidfds) as tracker:
        roots = {root_key(shell.pid): SESSION}
        assert len(tracker.look(roots)) == 100
        looks = 20
        began = time.thread_time()
        for _ in range(looks):
            assert len(tracker.look(roots)) == 100
        cpu_per_look_s = (time.thread_time() - began) / looks
        cost = tracker.last_cost
    assert not cost.full
    assert cost.stats == (101 if max_pidfds == 0 else 0) + cost.probed
    # The 0.2 % of a core target at one look per LOOK_INTERVAL_S, with a margin for a loaded
    # machine's other forks (each one probed).
    assert cpu_per_look_s < LOOK_INTERVAL_S * 0.002 * 2, cpu_per_look_s
    assert sorted(sleeps) == sorted(children_of(shell.pid))
