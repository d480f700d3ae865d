"""``session.terminate`` through the real daemon on a real socket (docs/design.md §7).

Every process here is real and listed the way a runtime lists it: exec
receipts, owned (pid, start) rows, and the descendants the daemon finds. The
daemon's answer is checked against what happened to the processes: the
signal each died of, or that it still runs.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec
import psutil
import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import DEADLINE_S, Processes, proc_state
from helpers.waits import wait_until
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from capsule_client import Client, NoSuchSession
from capsule_client.cli.main import main as capsulectl
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import EXEC_RECEIPT_TOLERANCE_S, write_exec_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot, TerminateReport
from capsuled.processes.exits import pidfds_supported
from capsuled.processes.terminate import START_TOLERANCE_S

pytestmark = pytest.mark.skipif(not pidfds_supported(), reason="no pidfd on this system")

#: A session process that starts a ``setsid`` grandchild (through a shell that stays) and a
#: double-fork daemon (its middle process exits at once), prints both pids, then waits.
#: Started as the leader of its own Unix session, as docs/design.md §5 tells runtimes to.
FORKS = """
import os, subprocess, time
shell = subprocess.Popen(["sh", "-c", "setsid sleep 300 & echo $!; wait"], stdout=subprocess.PIPE)
setsid_pid = int(shell.stdout.readline())
read_end, write_end = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        os.write(write_end, str(os.getpid()).encode())
        os.close(write_end)
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.close(write_end)
os.wait()
daemon_pid = int(os.read(read_end, 64))
print(shell.pid, setsid_pid, daemon_pid, flush=True)
time.sleep(300)
"""


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    """A client of the test's own daemon (``daemon``: a fresh home, a child of this process)."""
    with Client(daemon.socket_path, timeout_s=30.0) as connected:
        yield connected
    assert daemon.process is not None and daemon.process.poll() is None, "the daemon died"


def own(
    home: Path, session_id: str, *, execs: Sequence[str] = (), pids: Sequence[int] = ()
) -> None:
    """Register a session and what it owns, as a runtime would."""
    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id, context_id=f"ctx_{session_id}")
        for exec_id in execs:
            store.register_exec(exec_id, session_id)
        for pid in pids:
            store.register_process(pid, session_id)


def listed(snapshot: ActiveSessionsSnapshot, session_id: str) -> dict[int, str]:
    """pid → kind of the session's processes in ``snapshot`` (empty if not active)."""
    for session in snapshot.sessions:
        if session.session_id == session_id:
            return {p.pid: p.kind for p in session.processes}
    return {}


def wait_listed(client: Client, session_id: str, expected: dict[int, str]) -> None:
    """Until a fresh snapshot lists exactly ``expected`` under ``session_id``."""
    seen: list[dict[int, str]] = []

    def matches() -> bool:
        seen.append(listed(client.snapshot(max_age_ms=0), session_id))
        return seen[-1] == expected

    try:
        wait_until(matches, timeout_s=10.0, interval_s=0.05, message=f"{session_id} listed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: last seen {seen[-1]}, expected {expected}") from None


def outcomes(report: TerminateReport) -> dict[int, str]:
    return {p.pid: p.outcome for p in report.processes}


def ended(pid: int) -> bool:
    """Gone, or a zombie its (possibly non-reaping) new parent left."""
    return proc_state(pid) in (None, "Z")


def test_orphaned_sleeps_of_a_killed_shell_stay_listed_and_end_with_the_session(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    shell = procs.start(
        ["sh", "-c", "sleep 300 & echo $!; sleep 300 & echo $!; wait"], stdout=subprocess.PIPE
    )
    assert shell.stdout is not None
    sleeps = sorted(int(shell.stdout.readline()) for _ in range(2))
    for pid in sleeps:
        procs.adopt(pid)
    own(daemon.home, "ses_orphans", execs=["exe_orphans"])
    write_exec_receipt(daemon.home, "exe_orphans", shell.pid, command="sh")
    wait_listed(client, "ses_orphans", {shell.pid: "exec", **dict.fromkeys(sleeps, "descendant")})

    shell.kill()
    shell.wait(timeout=DEADLINE_S)
    wait_listed(client, "ses_orphans", dict.fromkeys(sleeps, "descendant"))

    report = client.terminate("ses_orphans", grace_s=DEADLINE_S)
    assert report.session_id == "ses_orphans"
    assert outcomes(report) == dict.fromkeys(sleeps, "exited")
    assert {p.kind for p in report.processes} == {"descendant"}
    assert report.duration_ms < DEADLINE_S * 1000
    wait_until(lambda: all(ended(pid) for pid in sleeps), message="both sleeps ended")
    # Nothing of it is left: the session is no longer active.
    with pytest.raises(NoSuchSession) as caught:
        client.terminate("ses_orphans")
    assert caught.value.code == -32007


def test_a_process_that_ignores_term_is_killed_after_the_grace(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    stubborn, obedient = procs.ignoring_term(), procs.sleep()
    own(daemon.home, "ses_stubborn", pids=[stubborn.pid, obedient.pid])
    wait_listed(client, "ses_stubborn", {stubborn.pid: "process", obedient.pid: "process"})

    grace_s = 0.5
    report = client.terminate("ses_stubborn", grace_s=grace_s)

    assert outcomes(report) == {stubborn.pid: "killed", obedient.pid: "exited"}
    assert stubborn.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    assert obedient.wait(timeout=DEADLINE_S) == -signal.SIGTERM
    assert report.duration_ms >= grace_s * 1000


def test_a_receipt_start_time_within_its_tolerance_is_signalled_by_the_sampled_one(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    """A receipt's ``started_at`` 2 s off the real start is live (within the exec
    tolerance) but beyond the re-check's 1 s: the re-check uses the sampled start."""
    sleeper = procs.sleep()
    real_start = psutil.Process(sleeper.pid).create_time()
    own(daemon.home, "ses_skewed", execs=["exe_skewed"])
    write_exec_receipt(daemon.home, "exe_skewed", sleeper.pid, started_at_s=real_start - 2.0)
    wait_listed(client, "ses_skewed", {sleeper.pid: "exec"})
    (session,) = [s for s in client.snapshot(max_age_ms=0).sessions if s.session_id == "ses_skewed"]
    assert abs(session.processes[0].started_at - real_start) > START_TOLERANCE_S

    report = client.terminate("ses_skewed", grace_s=DEADLINE_S)

    assert outcomes(report) == {sleeper.pid: "exited"}
    assert report.processes[0].started_at == session.processes[0].started_at  # as listed
    assert sleeper.wait(timeout=DEADLINE_S) == -signal.SIGTERM


def test_a_clean_up_started_during_the_grace_is_found_and_signalled(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    """The shell's TERM trap starts a clean-up while the shell waits on: the daemon's
    fresh looks during the grace find it as a descendant and signal it too."""
    script = "trap 'sleep 300 & echo $!' TERM; sleep 300 & echo $!; wait; wait"
    shell = procs.start(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert shell.stdout is not None
    first = int(shell.stdout.readline())
    procs.adopt(first)
    own(daemon.home, "ses_trap", execs=["exe_trap"])
    write_exec_receipt(daemon.home, "exe_trap", shell.pid, command="sh")
    wait_listed(client, "ses_trap", {shell.pid: "exec", first: "descendant"})

    report = client.terminate("ses_trap", grace_s=2.0)

    clean_up = int(shell.stdout.readline())
    procs.adopt(clean_up)
    ended_as = outcomes(report)
    # A TERM that lands between the clean-up's fork and its exec meets the shell's trap
    # handler, which exec then forgets: that clean-up is killed after the grace instead,
    # and so is the shell, whose last wait waits for it.
    clean_up_ended = ended_as.pop(clean_up)
    assert clean_up_ended in ("exited", "killed"), ended_as
    shell_ended = ended_as.pop(shell.pid)
    assert ended_as == {first: "exited"}
    assert {p.kind for p in report.processes if p.pid != shell.pid} == {"descendant"}
    if clean_up_ended == "exited":
        assert shell_ended == "exited"
        assert shell.wait(timeout=DEADLINE_S) == 0  # the trap ran, the last wait returned
    else:
        assert shell_ended in ("exited", "killed")
    wait_until(lambda: ended(first) and ended(clean_up), message="the sleeps ended")


def test_a_receipt_whose_pid_was_reused_leaves_the_reuser_untouched(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    """The receipt's process exits and an unrelated process gets its pid.

    The observation already refuses the receipt (its start time is not the
    reuser's, docs/design.md §3 liveness), so the reuser is not listed at all:
    the session's other process is terminated, the reuser is neither
    signalled nor reported.
    """
    if os.geteuid() != 0 or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("forcing a pid's reuse needs a writable /proc/sys/kernel/ns_last_pid (root)")
    first, other = procs.sleep(), procs.sleep()
    own(daemon.home, "ses_reused", execs=["exe_reused"], pids=[other.pid])
    receipt = write_exec_receipt(daemon.home, "exe_reused", first.pid, command="sleep")
    started_at = json.loads(receipt.read_bytes())["started_at"]  # whole seconds, rounded
    wait_listed(client, "ses_reused", {first.pid: "exec", other.pid: "process"})
    # A real reuse comes later than the receipt's tolerance (here by a clear second).
    wait_until(
        lambda: time.time() > started_at + EXEC_RECEIPT_TOLERANCE_S + 1.0,
        timeout_s=EXEC_RECEIPT_TOLERANCE_S + 5,
        message="the clock to pass the receipt's tolerance",
    )
    first.kill()
    first.wait(timeout=DEADLINE_S)
    for _ in range(20):  # another process may take the pid first; try again
        with open("/proc/sys/kernel/ns_last_pid", "w") as counter:
            counter.write(str(first.pid - 1))
        reuser = procs.sleep()
        if reuser.pid == first.pid:
            break
    else:
        pytest.skip("could not make the pid be reused (a busy machine)")
    wait_listed(client, "ses_reused", {other.pid: "process"})

    report = client.terminate("ses_reused", grace_s=DEADLINE_S)

    assert outcomes(report) == {other.pid: "exited"}
    assert other.wait(timeout=DEADLINE_S) == -signal.SIGTERM
    assert reuser.poll() is None and proc_state(reuser.pid) == "S"


def test_a_setsid_grandchild_and_a_double_fork_daemon_are_terminated(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    root = procs.start(
        [sys.executable, "-c", FORKS], stdout=subprocess.PIPE, start_new_session=True
    )
    assert root.stdout is not None
    shell, setsid_sleep, forked = (int(pid) for pid in root.stdout.readline().split())
    for pid in (shell, setsid_sleep, forked):
        procs.adopt(pid)
    wait_until(lambda: proc_state(setsid_sleep) == "S", message="the setsid sleep running")
    assert os.getsid(setsid_sleep) == setsid_sleep  # a Unix session of its own
    assert psutil.Process(forked).ppid() != root.pid  # re-parented: found by its sid
    own(daemon.home, "ses_forks", execs=["exe_forks"])
    write_exec_receipt(daemon.home, "exe_forks", root.pid, command="python forks")
    descendants = dict.fromkeys((shell, setsid_sleep, forked), "descendant")
    wait_listed(client, "ses_forks", {root.pid: "exec", **descendants})

    report = client.terminate("ses_forks", grace_s=DEADLINE_S)

    assert outcomes(report) == dict.fromkeys((root.pid, shell, setsid_sleep, forked), "exited")
    assert root.wait(timeout=DEADLINE_S) == -signal.SIGTERM
    wait_until(
        lambda: all(ended(pid) for pid in (shell, setsid_sleep, forked)), message="all ended"
    )


def test_two_hundred_processes_in_one_call(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    sleeps = [procs.start(["sleep", "300"]) for _ in range(200)]
    wait_until(
        lambda: all(proc_state(p.pid) == "S" for p in sleeps),
        timeout_s=30.0,
        message="200 sleeps running",
    )
    own(daemon.home, "ses_many", pids=[p.pid for p in sleeps])
    wait_listed(client, "ses_many", {p.pid: "process" for p in sleeps})

    report = client.terminate("ses_many", grace_s=DEADLINE_S)

    assert outcomes(report) == {p.pid: "exited" for p in sleeps}
    assert [p.pid for p in report.processes] == sorted(p.pid for p in sleeps)
    assert all(p.wait(timeout=DEADLINE_S) == -signal.SIGTERM for p in sleeps)


def test_an_unknown_session_and_one_no_longer_active_are_no_such_session(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    with pytest.raises(NoSuchSession) as caught:
        client.terminate("ses_never_was")
    assert caught.value.code == -32007 and "ses_never_was" in caught.value.message

    sleeper = procs.sleep()
    own(daemon.home, "ses_over", pids=[sleeper.pid])
    wait_listed(client, "ses_over", {sleeper.pid: "process"})
    sleeper.kill()
    sleeper.wait(timeout=DEADLINE_S)
    with pytest.raises(NoSuchSession):
        client.terminate("ses_over")


def test_the_daemon_and_its_parent_are_refused_and_go_on(
    daemon: DaemonProcess, client: Client
) -> None:
    """Listed under a session (owned rows), the daemon and its parent (this test) are never
    signalled: both ``refused``, both still here. (The test's other children would be
    the session's descendants: it has none but the daemon.)"""
    own(daemon.home, "ses_protected", pids=[daemon.pid, os.getpid()])
    wait_listed(client, "ses_protected", {daemon.pid: "process", os.getpid(): "process"})

    report = client.terminate("ses_protected", grace_s=0.2)

    assert outcomes(report) == {daemon.pid: "refused", os.getpid(): "refused"}
    assert all("never signalled" in str(p.error) for p in report.processes)
    assert client.ping().pong


def test_capsulectl_terminate_prints_the_table_the_wire_result_and_exit_codes(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    socket = ["--socket", str(daemon.socket_path)]
    first, second = procs.sleep(), procs.sleep()
    own(daemon.home, "ses_cli_a", pids=[first.pid])
    own(daemon.home, "ses_cli_b", pids=[second.pid])
    wait_listed(client, "ses_cli_a", {first.pid: "process"})
    wait_listed(client, "ses_cli_b", {second.pid: "process"})

    out = io.StringIO()
    assert capsulectl(["terminate", "ses_cli_a", "--grace", "1", *socket], out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("session ses_cli_a: 1 process in ") and lines[0].endswith("1 exited")
    assert lines[2].split() == ["PID", "KIND", "OUTCOME", "COMMAND"]
    assert lines[3].split() == [str(first.pid), "process", "exited", "sleep", "300"]
    assert first.wait(timeout=DEADLINE_S) == -signal.SIGTERM

    out = io.StringIO()
    assert capsulectl(["terminate", "ses_cli_b", "--json", *socket], out=out) == 0
    wire = json.loads(out.getvalue())
    assert set(wire) == {"session_id", "processes", "duration_ms"}
    assert wire["processes"] == [
        {
            "pid": second.pid,
            "started_at": wire["processes"][0]["started_at"],
            "kind": "process",
            "outcome": "exited",
            "command": ["sleep", "300"],
        }
    ]
    assert msgspec.json.decode(out.getvalue(), type=TerminateReport).session_id == "ses_cli_b"

    assert capsulectl(["terminate", "ses_cli_a", *socket], out=io.StringIO()) == 1  # -32007


def test_metrics_and_status_count_the_outcomes(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    def counted() -> dict[str, float]:
        families = text_string_to_metric_families(client.metrics().text)
        family = next(f for f in families if f.name == "capsuled_terminated_processes")
        return {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}

    before, totals_before = counted(), client.status().totals
    stubborn, obedient = procs.ignoring_term(), procs.sleep()
    own(daemon.home, "ses_counted", pids=[stubborn.pid, obedient.pid, daemon.pid])
    wait_listed(
        client,
        "ses_counted",
        {stubborn.pid: "process", obedient.pid: "process", daemon.pid: "process"},
    )

    report = client.terminate("ses_counted", grace_s=0.3)

    assert sorted(outcomes(report).values()) == ["exited", "killed", "refused"]
    after, totals = counted(), client.status().totals
    assert {o: after[o] - before[o] for o in after} == {
        "exited": 1,
        "killed": 1,
        "gone": 0,
        "refused": 1,
        "spared": 0,
    }
    assert totals.terminated_exited == totals_before.terminated_exited + 1
    assert totals.terminated_killed == totals_before.terminated_killed + 1
    assert totals.terminated_refused == totals_before.terminated_refused + 1
    assert totals.terminated_gone == totals_before.terminated_gone
