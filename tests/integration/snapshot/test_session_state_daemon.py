"""A session's state through the real daemon (docs/design.md §13): a snapshot, a
subscription and the metrics see a session end when its own process goes and only
what it started is left, without a timer of the daemon's own."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import proc_state
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import Session

DEADLINE_S = 10.0


class Shell:
    """``sh -c 'sleep 300 & read x'``: a root that exits on a line, leaving its sleep."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            ["sh", "-c", "sleep 300 & echo $!; read x"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            process_group=0,
        )
        assert self.process.stdout is not None
        self.child = int(self.process.stdout.readline())

    def leave(self) -> None:
        """The root exits; its sleep goes on, re-parented."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"bye\n")
        self.process.stdin.close()
        self.process.wait(timeout=DEADLINE_S)

    def close(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=DEADLINE_S)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def shell() -> Iterator[Shell]:
    started = Shell()
    try:
        yield started
    finally:
        started.close()


def own(daemon: DaemonProcess, shell: Shell, session_id: str = "ses_a") -> None:
    with OwnershipStore(store_path(daemon.home)) as store:
        store.register_session(session_id)
        store.register_exec(f"exe_{session_id}", session_id)
    write_exec_receipt(daemon.home, f"exe_{session_id}", shell.process.pid, command="sh")


def session_of(client: Client, session_id: str = "ses_a") -> Session | None:
    for session in client.snapshot(fresh=True).sessions:
        if session.session_id == session_id:
            return session
    return None


def gauge(text: str, state: str) -> float:
    (line,) = [
        x for x in text.splitlines() if x.startswith(f'capsuled_sessions{{state="{state}"}}')
    ]
    return float(line.split()[-1])


def test_a_session_ends_when_its_own_process_goes_and_says_when(
    daemon: DaemonProcess, shell: Shell
) -> None:
    own(daemon, shell)
    with Client(daemon.socket_path) as client:
        running = wait_until(
            lambda: (s := session_of(client)) is not None and len(s.processes) == 2 and s,
            timeout_s=DEADLINE_S,
            message="the shell and its sleep listed",
        )
        assert running.state == "running"
        metrics = client.metrics().text
        assert (gauge(metrics, "running"), gauge(metrics, "ended")) == (1, 0)

        before = time.time()
        shell.leave()
        ended = session_of(client)  # read-your-writes: the exit happened before
        after = time.time()
        assert ended is not None and ended.state == "ended"
        assert [(p.kind, p.pid) for p in ended.processes] == [("descendant", shell.child)]
        assert isinstance(ended.ended_at, float) and before <= ended.ended_at <= after
        metrics = client.metrics().text
        assert (gauge(metrics, "running"), gauge(metrics, "ended")) == (0, 1)

        raw = client.call_raw("sessions.snapshot", {"max_age_ms": 0})
        assert b'"state":"ended","ended_at":' in raw

        os.kill(shell.child, signal.SIGKILL)
        wait_until(lambda: proc_state(shell.child) is None, message="the sleep reaped")
        assert session_of(client) is None  # nothing of it left: not active


def test_a_subscription_hears_the_session_end(daemon: DaemonProcess, shell: Shell) -> None:
    own(daemon, shell)
    with Client(daemon.socket_path) as client:
        wait_until(
            lambda: (s := session_of(client)) is not None and len(s.processes) == 2,
            timeout_s=DEADLINE_S,
            message="the shell and its sleep listed",
        )
    with Client(daemon.socket_path) as watcher, watcher.subscribe() as changes:
        first = next(iter(changes))
        (added,) = first.added
        assert added.state == "running"
        shell.leave()
        change = next(iter(changes))
        (changed,) = change.changed
        assert (changed.session_id, changed.state) == ("ses_a", "ended")
        assert isinstance(changed.ended_at, float)
        assert change.generation != first.generation
