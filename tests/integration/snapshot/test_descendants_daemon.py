"""Descendants through the real daemon: real process trees under receipts (docs/design.md §5).

Each tree is started in its own process group (killed whole at the end);
``setsid`` is used only where a test says so, because a root that leads its
Unix session makes every process in it a descendant by its ``sid``.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import proc_state
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.cli.main import main as capsulectl
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot, SessionProcess

DEADLINE_S = 10.0  # a look is every second; slack for a loaded machine


class Trees:
    """Real process trees, each in a process group of its own, all killed afterwards."""

    def __init__(self) -> None:
        self.roots: list[subprocess.Popen[bytes]] = []
        self.strays: list[int] = []  # processes outside the groups (setsid): killed by pid

    def start(self, script: str, *, new_session: bool = False) -> subprocess.Popen[bytes]:
        root = subprocess.Popen(
            ["sh", "-c", script],
            stdin=subprocess.PIPE,
            start_new_session=new_session,
            process_group=None if new_session else 0,
        )
        self.roots.append(root)
        return root

    def close(self) -> None:
        for pid in self.strays:
            if proc_state(pid) is not None:
                os.kill(pid, signal.SIGKILL)
        for root in self.roots:
            try:
                os.killpg(root.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if root.stdin is not None:
                root.stdin.close()
            root.wait(timeout=5)


@pytest.fixture
def trees() -> Iterator[Trees]:
    pool = Trees()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def daemon(short_dir: Path) -> Iterator[DaemonProcess]:
    """A real capsuled on a fresh home, with its default settings (no sampling timer)."""
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with DaemonProcess(home, short_dir / "d.sock", []) as process:
        yield process


def children(pid: int) -> list[int]:
    """The live children of ``pid``, from every ``/proc/<pid>/stat``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            data = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != b"Z":
            found.append(int(name))
    return sorted(found)


def sleeps_of(pid: int, count: int) -> list[int]:
    """The ``count`` running children of ``pid`` (waited for)."""
    return wait_until(
        lambda: (
            len(kids := children(pid)) == count
            and all(proc_state(kid) == "S" for kid in kids)
            and kids
        ),
        message=f"{count} children of {pid}",
    )


def own_exec(home: Path, session_id: str, exec_id: str, pid: int) -> None:
    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id)
        store.register_exec(exec_id, session_id)
    write_exec_receipt(home, exec_id, pid, command="sh")


def listed(snapshot: ActiveSessionsSnapshot, session_id: str) -> dict[int, SessionProcess]:
    """pid → process of ``session_id`` in ``snapshot`` (empty if it is not listed)."""
    for session in snapshot.sessions:
        if session.session_id == session_id:
            return {process.pid: process for process in session.processes}
    return {}


def wait_listed(
    client: Client, session_id: str, check: object, message: str
) -> dict[int, SessionProcess]:
    assert callable(check)
    return wait_until(
        lambda: check(found := listed(client.snapshot(), session_id)) and found,
        timeout_s=DEADLINE_S,
        message=message,
    )


def test_children_are_listed_and_outlive_their_parent(daemon: DaemonProcess, trees: Trees) -> None:
    shell = trees.start("sleep 300 & sleep 300 & wait")
    first, second = sleeps_of(shell.pid, 2)
    own_exec(daemon.home, "ses_a", "exe_sh", shell.pid)
    with Client(daemon.socket_path) as client:
        found = wait_listed(
            client, "ses_a", lambda f: {first, second} <= f.keys(), "both sleeps listed"
        )
        assert found[shell.pid].kind == "exec"
        for pid in (first, second):
            assert found[pid].kind == "descendant"
            assert found[pid].parent_pid == shell.pid
            assert found[pid].root_pid == shell.pid
        assert client.snapshot().unowned == []

        os.kill(shell.pid, signal.SIGKILL)
        shell.wait(timeout=5)
        found = wait_listed(client, "ses_a", lambda f: shell.pid not in f, "the shell gone")
        # The session stays active through its orphaned descendants, which keep their lineage.
        assert sorted(found) == [first, second]
        assert {found[first].parent_pid, found[second].root_pid} == {shell.pid}

        os.kill(first, signal.SIGKILL)
        found = wait_listed(client, "ses_a", lambda f: first not in f, "the killed sleep gone")
        assert sorted(found) == [second]
        os.kill(second, signal.SIGKILL)
        wait_until(
            lambda: listed(client.snapshot(), "ses_a") == {},
            timeout_s=DEADLINE_S,
            message="the session gone with its last descendant",
        )


def test_a_setsid_grandchild_started_after_the_first_look_is_listed(
    daemon: DaemonProcess, trees: Trees
) -> None:
    shell = trees.start('read go; sh -c "setsid sleep 300 & wait" & wait')
    own_exec(daemon.home, "ses_b", "exe_sh", shell.pid)
    with Client(daemon.socket_path) as client:
        wait_listed(client, "ses_b", lambda f: shell.pid in f, "the shell listed")
        assert shell.stdin is not None
        shell.stdin.write(b"go\n")
        shell.stdin.flush()
        (middle,) = sleeps_of(shell.pid, 1)
        (grandchild,) = sleeps_of(middle, 1)
        trees.strays.append(grandchild)  # its own Unix session and process group
        found = wait_listed(client, "ses_b", lambda f: grandchild in f, "the grandchild listed")
        assert found[grandchild].kind == "descendant"
        assert found[grandchild].parent_pid == middle
        assert found[grandchild].root_pid == shell.pid


def test_setsid_before_the_first_look_escapes_as_documented(
    daemon: DaemonProcess, trees: Trees
) -> None:
    # The subshell starts a setsid sleep and exits before the daemon ever sees the
    # root: the sleep is re-parented and leads a session of its own.
    shell = trees.start("(setsid sleep 301 &); read go")
    escapee = wait_until(lambda: _session_of_own(shell.pid), message="the escaped sleep")
    trees.strays.append(escapee)
    own_exec(daemon.home, "ses_c", "exe_sh", shell.pid)
    with Client(daemon.socket_path) as client:
        found = wait_listed(client, "ses_c", lambda f: shell.pid in f, "the shell listed")
        snapshot = client.snapshot(max_age_ms=0)
    assert escapee not in listed(snapshot, "ses_c"), found
    assert all(p.pid != escapee for p in snapshot.unowned)


def test_a_double_fork_under_a_setsid_root_stays_in_its_session(
    daemon: DaemonProcess, trees: Trees
) -> None:
    # The fix a runtime applies: the root leads its Unix session, so a daemon that
    # forks twice and lets its middle process exit is still known by its sid.
    shell = trees.start('read go; sh -c "sleep 300 &"; read end', new_session=True)
    own_exec(daemon.home, "ses_d", "exe_sh", shell.pid)
    with Client(daemon.socket_path) as client:
        wait_listed(client, "ses_d", lambda f: shell.pid in f, "the shell listed")
        assert shell.stdin is not None
        shell.stdin.write(b"go\n")
        shell.stdin.flush()
        daemonized = wait_until(
            lambda: (
                (kids := [p for p in _in_session(shell.pid) if _cmdline(p) == b"sleep\x00300\x00"])
                and kids[0]
            ),
            message="the double-forked sleep",
        )
        found = wait_listed(client, "ses_d", lambda f: daemonized in f, "the daemon listed")
    assert found[daemonized].kind == "descendant"
    assert found[daemonized].root_pid == shell.pid


def test_a_since_long_poll_wakes_when_a_descendant_appears(
    daemon: DaemonProcess, trees: Trees
) -> None:
    shell = trees.start("read go; sleep 300 & wait")
    own_exec(daemon.home, "ses_e", "exe_sh", shell.pid)
    with Client(daemon.socket_path) as client:
        wait_listed(client, "ses_e", lambda f: shell.pid in f, "the shell listed")
        current = client.snapshot()
    answers: list[ActiveSessionsSnapshot] = []
    polling = threading.Event()

    def long_poll() -> None:
        with Client(daemon.socket_path) as poller:
            polling.set()
            answers.append(poller.snapshot(since=current.generation, timeout_ms=20_000))

    poll = threading.Thread(target=long_poll)
    poll.start()
    assert polling.wait(5)
    assert shell.stdin is not None
    shell.stdin.write(b"go\n")
    shell.stdin.flush()
    (sleep,) = sleeps_of(shell.pid, 1)
    poll.join(timeout=20)
    assert not poll.is_alive()
    assert answers[0].generation > current.generation
    assert listed(answers[0], "ses_e")[sleep].kind == "descendant"


def test_capsulectl_sessions_shows_descendants_under_their_root(
    daemon: DaemonProcess, trees: Trees
) -> None:
    shell = trees.start("sleep 300 & wait")
    (sleep,) = sleeps_of(shell.pid, 1)
    own_exec(daemon.home, "ses_f", "exe_sh", shell.pid)
    with Client(daemon.socket_path) as client:
        wait_listed(client, "ses_f", lambda f: sleep in f, "the sleep listed")
    out = io.StringIO()
    assert capsulectl(["sessions", "--socket", str(daemon.socket_path)], out=out) == 0
    lines = out.getvalue().splitlines()
    (root_at,) = [i for i, line in enumerate(lines) if f" {shell.pid} " in line]
    assert " exec " in lines[root_at]
    child = lines[root_at + 1]
    assert f" {sleep} " in child and "descendant" in child and "\\_ " in child, lines


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _stat_fields(pid: int) -> list[bytes]:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return []
    return data[data.rindex(b")") + 2 :].split()


def _session_of_own(shell_pid: int) -> int | None:
    """The sleep that left with setsid (ppid 1 or a subreaper, its own session), if any."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == shell_pid:
            continue
        pid = int(name)
        fields = _stat_fields(pid)
        if len(fields) > 4 and int(fields[3]) == pid and _cmdline(pid) == b"sleep\x00301\x00":
            if pid > shell_pid:
                return pid
    return None


def _in_session(sid: int) -> set[int]:
    """The live processes whose session id is ``sid``."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if len(fields) > 4 and int(fields[3]) == sid and fields[0] != b"Z":
                found.add(int(name))
    return found
