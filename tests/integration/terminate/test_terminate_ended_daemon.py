"""``capsulectl terminate --ended`` through the real daemon (docs/design.md §13): every
ended session's leftovers stopped, one report each; a running session untouched, also
when it has live descendants; ``--dry-run`` and ``--older-than``; a failure's exit status.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess
from helpers.listeners import NOBODY, UnprivilegedDaemon
from helpers.processes import proc_state
from helpers.waits import wait_until

from capsule_client import Client, NoSuchSession
from capsule_client.cli.main import main as capsulectl
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import Session

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

DEADLINE_S = 10.0


class Trees:
    """``sh -c 'CHILD & echo $!; read x'`` roots, each in a process group of its own: a
    root leaves on a line of input, its child goes on. All killed at the end."""

    def __init__(self) -> None:
        self.roots: list[subprocess.Popen[bytes]] = []
        self.children: list[int] = []

    def start(self, child: str = "sleep 300") -> tuple[subprocess.Popen[bytes], int]:
        root = subprocess.Popen(
            ["sh", "-c", f"{child} & echo $!; read x"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            process_group=0,
        )
        self.roots.append(root)
        assert root.stdout is not None
        pid = int(root.stdout.readline())
        self.children.append(pid)
        return root, pid

    @staticmethod
    def leave(root: subprocess.Popen[bytes]) -> None:
        assert root.stdin is not None
        root.stdin.write(b"bye\n")
        root.stdin.close()
        root.wait(timeout=DEADLINE_S)

    def close(self) -> None:
        for pid in self.children:  # a child as nobody is in no group of ours to kill
            if proc_state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)
        for root in self.roots:
            try:
                os.killpg(root.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            root.wait(timeout=DEADLINE_S)
            for pipe in (root.stdin, root.stdout):
                if pipe is not None:
                    pipe.close()


@pytest.fixture
def trees() -> Iterator[Trees]:
    started = Trees()
    try:
        yield started
    finally:
        started.close()


def own(home: Path, session_id: str, pid: int) -> None:
    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id)
        store.register_exec(f"exe_{session_id}", session_id)
    write_exec_receipt(home, f"exe_{session_id}", pid, command="sh")


def sessions(socket_path: Path) -> dict[str, Session]:
    with Client(socket_path) as client:
        return {s.session_id: s for s in client.snapshot(fresh=True).sessions}


def processes_of(daemon: DaemonProcess, session_id: str) -> list[int]:
    found = sessions(daemon.socket_path).get(session_id)
    return [] if found is None else [p.pid for p in found.processes]


def gone(pid: int) -> bool:
    return proc_state(pid) in (None, "Z")


def ctl(daemon: DaemonProcess, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = capsulectl(["--socket", str(daemon.socket_path), "terminate", *args], out=out)
    return code, out.getvalue()


@pytest.fixture
def two(daemon: DaemonProcess, trees: Trees) -> tuple[int, int, int]:
    """``ses_run``, running with a live descendant, and ``ses_end``, ended with one left:
    (the running root, its child, the ended session's leftover)."""
    running, running_child = trees.start()
    ending, leftover = trees.start()
    own(daemon.home, "ses_run", running.pid)
    own(daemon.home, "ses_end", ending.pid)
    wait_until(
        lambda: len(processes_of(daemon, "ses_run")) == len(processes_of(daemon, "ses_end")) == 2,
        timeout_s=DEADLINE_S,
        message="both sessions with their children",
    )
    trees.leave(ending)
    found = sessions(daemon.socket_path)
    assert (found["ses_run"].state, found["ses_end"].state) == ("running", "ended")
    return running.pid, running_child, leftover


def test_the_ended_sessions_leftovers_stop_and_a_running_session_is_untouched(
    daemon: DaemonProcess, two: tuple[int, int, int]
) -> None:
    running, running_child, leftover = two
    code, text = ctl(daemon, "--ended", "--grace", "2")
    assert code == 0, text
    assert "session ses_end: 1 process in" in text and str(leftover) in text
    assert "ses_run" not in text
    assert text.rstrip().endswith("1 ended session: 1 terminated, 0 running again, 0 failed")
    wait_until(lambda: gone(leftover), message="the leftover stopped")
    assert not gone(running) and not gone(running_child)
    assert set(sessions(daemon.socket_path)) == {"ses_run"}

    code, text = ctl(daemon, "--ended")  # nothing ended any more
    assert (code, text.strip()) == (0, "no ended session: nothing to stop")


def test_dry_run_lists_and_stops_nothing(daemon: DaemonProcess, two: tuple[int, int, int]) -> None:
    running, _, leftover = two
    code, text = ctl(daemon, "--ended", "--dry-run")
    assert code == 0
    assert text.splitlines()[0].startswith("would terminate ses_end (ended ")
    assert str(leftover) in text and str(running) not in text
    assert text.rstrip().endswith("dry run: 1 ended session, nothing stopped")
    code, text = ctl(daemon, "--ended", "--dry-run", "--json")
    assert code == 0
    assert [s["session_id"] for s in json.loads(text)] == ["ses_end"]
    assert not gone(leftover)
    assert sessions(daemon.socket_path)["ses_end"].state == "ended"


def test_older_than_keeps_the_sessions_that_ended_that_long_ago(
    daemon: DaemonProcess, two: tuple[int, int, int]
) -> None:
    _, _, leftover = two
    code, text = ctl(daemon, "--ended", "--older-than", "1h")
    assert code == 0
    assert text.startswith("no session ended 1h00m ago or longer: nothing to stop (1 ended")
    assert not gone(leftover)
    code, text = ctl(daemon, "--ended", "--older-than", "0s", "--json", "--grace", "2")
    assert code == 0
    (report,) = json.loads(text)
    assert report["session_id"] == "ses_end"
    assert [(p["pid"], p["outcome"]) for p in report["processes"]] == [(leftover, "exited")]


def test_the_daemon_refuses_ended_only_for_a_running_session(
    daemon: DaemonProcess, two: tuple[int, int, int]
) -> None:
    running, running_child, _ = two
    with Client(daemon.socket_path) as client, pytest.raises(NoSuchSession) as raised:
        client.terminate("ses_run", ended_only=True, grace_s=1)
    assert raised.value.data == {"session_id": "ses_run", "state": "running"}
    assert "is running; nothing was signalled" in raised.value.message
    assert not gone(running) and not gone(running_child)


@pytest.mark.parametrize("args", [["ses_x", "--ended"], [], ["ses_x", "--dry-run"]])
def test_a_bad_combination_is_a_usage_error(
    daemon: DaemonProcess, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl(daemon, *args)[0] == 2
    assert "capsulectl terminate: error:" in capsys.readouterr().err


def test_a_leftover_the_daemon_may_not_signal_fails_the_command(
    short_dir: Path, trees: Trees
) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to leave a process of another user")
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with UnprivilegedDaemon(home, short_dir / "u.sock") as daemon:
        root, theirs = trees.start(
            f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups sleep 300"
        )
        own(home, "ses_theirs", root.pid)
        wait_until(
            lambda: len(processes_of(daemon, "ses_theirs")) == 2,
            timeout_s=DEADLINE_S,
            message="the root and its child as nobody",
        )
        trees.leave(root)
        code, text = ctl(daemon, "--ended", "--grace", "0")
        assert code == 1, text
        assert "refused" in text and str(theirs) in text
        assert text.rstrip().endswith("0 running again, 1 failed")
        assert not gone(theirs)
