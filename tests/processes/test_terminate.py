"""session.terminate's signalling with real processes (capsuled.processes.terminate)."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator

import anyio
import msgspec
import pytest
import structlog
import structlog.testing
from helpers.processes import DEADLINE_S, Processes, proc_state
from helpers.waits import wait_until

from capsule_client.wire import TerminateReport
from capsuled.processes.descendants import DescendantTracker
from capsuled.processes.exits import pidfds_supported
from capsuled.processes.table import Clock, proc_stat
from capsuled.processes.terminate import START_TOLERANCE_S, Target, terminate

pytestmark = pytest.mark.skipif(not pidfds_supported(), reason="no pidfd on this system")

SLEEP = ["sleep", "300"]


@pytest.fixture
def pool() -> Iterator[Processes]:
    processes = Processes()
    try:
        yield processes
    finally:
        processes.close()


def target(pid: int, kind: str = "process") -> Target:
    """The target an observation would list for a running ``pid``."""
    stat = proc_stat(pid)
    assert stat is not None, pid
    start_s = Clock().seconds(stat.start_ticks)
    return Target(pid, int(start_s), kind, start_s)  # type: ignore[arg-type]


def run(targets: Iterable[Target], **kwargs: object) -> TerminateReport:
    async def main() -> TerminateReport:
        return await terminate("ses_test", list(targets), **kwargs)  # type: ignore[arg-type]

    return anyio.run(main)


def outcomes(report: TerminateReport) -> dict[int, str]:
    return {process.pid: process.outcome for process in report.processes}


def test_processes_that_obey_term_exit(pool: Processes) -> None:
    sleeps = [pool.sleep() for _ in range(3)]
    report = run([target(p.pid) for p in sleeps], grace_s=DEADLINE_S)
    assert outcomes(report) == {p.pid: "exited" for p in sleeps}
    assert all(p.wait(timeout=DEADLINE_S) == -signal.SIGTERM for p in sleeps)
    assert report.session_id == "ses_test" and report.duration_ms < DEADLINE_S * 1000


def test_a_process_that_ignores_term_is_killed_after_the_grace(pool: Processes) -> None:
    stubborn, obedient = pool.ignoring_term(), pool.sleep()
    began = time.monotonic()
    report = run([target(stubborn.pid), target(obedient.pid)], grace_s=0.3)
    assert outcomes(report) == {stubborn.pid: "killed", obedient.pid: "exited"}
    assert stubborn.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    assert 300 <= report.duration_ms <= (time.monotonic() - began) * 1000 + 1


def test_each_call_is_logged_at_info_with_the_count_of_each_outcome(pool: Processes) -> None:
    stubborn, obedient = pool.ignoring_term(), pool.sleep()
    with structlog.testing.capture_logs() as logs:
        run([target(stubborn.pid), target(obedient.pid)], grace_s=0.3)
    [entry] = [e for e in logs if e["event"] == "session terminated"]
    assert entry["log_level"] == "info" and entry["session_id"] == "ses_test"
    assert entry["signal"] == "TERM" and entry["processes"] == 2
    assert (entry["exited"], entry["killed"], entry["gone"], entry["refused"]) == (1, 1, 0, 0)


def test_kill_first_is_killed_without_a_grace(pool: Processes) -> None:
    stubborn = pool.ignoring_term()
    report = run([target(stubborn.pid)], signal_name="KILL", grace_s=60.0)
    assert outcomes(report) == {stubborn.pid: "killed"}
    assert report.duration_ms < 30_000


def test_int_and_hup_are_what_is_sent(pool: Processes) -> None:
    first, second = pool.sleep(), pool.sleep()
    assert outcomes(run([target(first.pid)], signal_name="INT")) == {first.pid: "exited"}
    assert outcomes(run([target(second.pid)], signal_name="HUP")) == {second.pid: "exited"}
    assert first.wait(timeout=DEADLINE_S) == -signal.SIGINT
    assert second.wait(timeout=DEADLINE_S) == -signal.SIGHUP


def test_a_process_already_gone_is_reported_gone(pool: Processes) -> None:
    dead, zombie = pool.sleep(), pool.sleep()
    observed = [target(dead.pid), target(zombie.pid)]
    dead.kill()
    dead.wait(timeout=DEADLINE_S)
    zombie.kill()
    wait_until(lambda: proc_state(zombie.pid) == "Z", message="a zombie")
    report = run(observed)
    assert outcomes(report) == {dead.pid: "gone", zombie.pid: "gone"}


def test_a_start_time_that_does_not_match_is_gone_and_untouched(pool: Processes) -> None:
    sleep = pool.sleep()
    seen = target(sleep.pid)
    older = Target(sleep.pid, seen.started_at - 60, "process", seen.start_s - 60)  # type: ignore[operator]
    assert outcomes(run([older])) == {sleep.pid: "gone"}
    assert sleep.poll() is None and proc_state(sleep.pid) == "S"


def _write_ns_last_pid(value: int) -> bool:
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w") as file:
            file.write(str(value))
    except OSError:
        return False
    return True


def test_a_reused_pid_is_never_signalled(pool: Processes) -> None:
    """The observed process exits, its pid is given to an unrelated one: that one lives."""
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK) or os.geteuid() != 0:
        pytest.skip("forcing a pid's reuse needs a writable /proc/sys/kernel/ns_last_pid (root)")
    first = pool.sleep()
    observed, seen_at = target(first.pid), time.monotonic()
    # The reuser must start later than the tolerance allows, as any real reuse does.
    wait_until(
        lambda: time.monotonic() > seen_at + START_TOLERANCE_S + 0.5,
        message="the clock to pass the start-time tolerance",
    )
    first.kill()
    first.wait(timeout=DEADLINE_S)
    for _ in range(20):  # another process may take the pid first; try again
        if not _write_ns_last_pid(observed.pid - 1):
            pytest.skip("ns_last_pid refused the write")
        reuser = pool.sleep()
        if reuser.pid == observed.pid:
            break
    else:
        pytest.skip("could not make the pid be reused (a busy machine)")
    assert outcomes(run([observed])) == {observed.pid: "gone"}
    assert reuser.poll() is None and proc_state(reuser.pid) == "S"


def test_protected_pids_are_refused_and_untouched() -> None:
    parent = target(os.getppid())
    ourselves = target(os.getpid())
    init = Target(1, 0, "process")
    report = run([parent, ourselves, init])
    assert outcomes(report) == {os.getppid(): "refused", os.getpid(): "refused", 1: "refused"}
    assert all("never signalled" in str(p.error) for p in report.processes)


def test_a_process_of_another_user_is_refused(pool: Processes) -> None:
    if os.geteuid() != 0:
        pytest.skip("starting a process of another uid needs root")
    other = pool.start(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *SLEEP])
    wait_until(lambda: proc_state(other.pid) == "S", message="nobody's sleep running")
    # Root may signal anyone: terminate from a root without CAP_KILL, which meets EPERM.
    script = (
        "import anyio, msgspec, sys\n"
        "from capsuled.processes.terminate import Target, terminate\n"
        f"t = Target({other.pid}, {target(other.pid).started_at}, 'process')\n"
        "report = msgspec.json.encode(anyio.run(terminate, 'ses_x', [t]))\n"
        "sys.stdout.write('\\n' + report.decode())\n"  # after structlog's default output
    )
    done = subprocess.run(
        ["setpriv", "--bounding-set=-kill", sys.executable, "-c", script],
        capture_output=True,
        timeout=30,
        check=True,
    )
    report = msgspec.json.decode(done.stdout.splitlines()[-1], type=TerminateReport)
    assert outcomes(report) == {other.pid: "refused"}
    assert "not permitted" in str(report.processes[0].error)
    assert other.poll() is None and proc_state(other.pid) == "S"


def test_descendants_that_appear_during_the_grace_are_signalled(pool: Processes) -> None:
    stubborn = pool.ignoring_term()
    late: list[subprocess.Popen[bytes]] = []

    async def more() -> list[Target]:
        if not late:
            late.append(pool.sleep())  # appears after the first signal
        return [target(stubborn.pid), target(late[0].pid, "descendant")]

    report = run([target(stubborn.pid)], grace_s=0.5, more=more)
    assert outcomes(report) == {stubborn.pid: "killed", late[0].pid: "exited"}
    assert late[0].wait(timeout=DEADLINE_S) == -signal.SIGTERM
    assert {p.kind for p in report.processes} == {"process", "descendant"}


def test_two_hundred_processes_in_one_call(pool: Processes) -> None:
    sleeps = [pool.start(["sleep", "300"]) for _ in range(200)]
    wait_until(lambda: all(proc_state(p.pid) == "S" for p in sleeps), message="200 sleeps running")
    report = run([target(p.pid) for p in sleeps], grace_s=DEADLINE_S)
    assert outcomes(report) == {p.pid: "exited" for p in sleeps}
    assert [p.pid for p in report.processes] == sorted(p.pid for p in sleeps)
    assert all(p.wait(timeout=DEADLINE_S) == -signal.SIGTERM for p in sleeps)


def test_a_clean_up_started_by_a_term_trap_is_found_and_signalled(pool: Processes) -> None:
    """The session's processes and its descendants, as the tracker finds them, end together:
    the shell's TERM trap starts a clean-up as the shell exits; the clean-up is signalled too."""
    script = "trap 'sleep 300 & echo $!; exit 0' TERM; sleep 300 & echo $!; wait"
    shell = pool.start(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert shell.stdout is not None
    first = int(shell.stdout.readline())
    wait_until(lambda: proc_state(first) == "S", message="the first sleep running")
    tracker = DescendantTracker(children_files=False)
    roots = {(shell.pid, target(shell.pid).started_at): "ses_test"}

    def session_now() -> list[Target]:
        found = tracker.look(roots)
        return [Target(pid, started_at, "descendant") for pid, started_at in found]

    async def main() -> TerminateReport:
        listed = [target(shell.pid), *session_now()]
        assert [t.pid for t in listed] == [shell.pid, first]

        async def more() -> list[Target]:
            return await anyio.to_thread.run_sync(session_now)

        return await terminate("ses_test", listed, grace_s=1.0, more=more)

    report = anyio.run(main)
    clean_up = int(shell.stdout.readline())
    ended = outcomes(report)
    # A TERM that lands between the clean-up's fork and its exec meets the shell's trap
    # handler, which exec then forgets: that clean-up is killed after the grace instead.
    assert ended.pop(clean_up) in ("exited", "killed")
    assert ended == {shell.pid: "exited", first: "exited"}
    assert {p.kind for p in report.processes if p.pid != shell.pid} == {"descendant"}
    assert proc_state(first) in (None, "Z") and proc_state(clean_up) in (None, "Z")


def test_orphaned_sleeps_of_a_killed_shell_are_still_the_sessions_and_end_with_it(
    pool: Processes,
) -> None:
    """The shell under a receipt is killed; its two sleeps stay listed; terminate ends them."""
    shell = pool.start(
        ["sh", "-c", "sleep 300 & echo $!; sleep 300 & echo $!; wait"], stdout=subprocess.PIPE
    )
    assert shell.stdout is not None
    sleeps = sorted(int(shell.stdout.readline()) for _ in range(2))
    for pid in sleeps:
        wait_until(lambda pid=pid: proc_state(pid) == "S", message=f"sleep {pid} running")
    tracker = DescendantTracker(children_files=False)
    roots = {(shell.pid, target(shell.pid).started_at): "ses_test"}
    assert sorted(pid for pid, _ in tracker.look(roots)) == sleeps
    shell.kill()
    shell.wait(timeout=DEADLINE_S)
    found = tracker.look({})  # the receipt's process is gone: only descendants are left
    assert sorted(pid for pid, _ in found) == sleeps
    assert {(d.parent_pid, d.root_pid) for d in found.values()} == {(shell.pid, shell.pid)}
    listed = [Target(pid, started_at, "descendant") for pid, started_at in found]
    report = run(listed, grace_s=DEADLINE_S)
    assert outcomes(report) == dict.fromkeys(sleeps, "exited")
    wait_until(lambda: all(proc_state(pid) in (None, "Z") for pid in sleeps), message="gone")
    assert tracker.look({}) == {}


def test_without_pidfds_the_start_time_is_checked_before_kill(pool: Processes) -> None:
    obedient, stubborn, dead = pool.sleep(), pool.ignoring_term(), pool.sleep()
    observed = [target(obedient.pid), target(stubborn.pid), target(dead.pid)]
    dead.kill()
    dead.wait(timeout=DEADLINE_S)
    report = run(observed, grace_s=0.3, pidfds=False)
    assert outcomes(report) == {obedient.pid: "exited", stubborn.pid: "killed", dead.pid: "gone"}
    assert obedient.wait(timeout=DEADLINE_S) == -signal.SIGTERM
    assert stubborn.wait(timeout=DEADLINE_S) == -signal.SIGKILL


def test_out_of_descriptors_nothing_is_signalled(pool: Processes) -> None:
    """docs/design.md §8: with no descriptor for its checks, terminate signals nothing
    (the handler answers -32001) rather than signal blindly or call a process gone."""
    sleep = pool.sleep()
    listed = target(sleep.pid)  # as the observation listed it, before the shortage

    async def main() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))  # no descriptor number left
        try:
            await terminate("ses_test", [listed], grace_s=0.1)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    with pytest.raises(OSError) as raised:
        anyio.run(main)
    assert raised.value.errno == errno.EMFILE
    assert sleep.poll() is None  # not signalled
