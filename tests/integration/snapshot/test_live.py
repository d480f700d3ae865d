"""Live answers against the real daemon with sampling effectively off (docs/design.md §7).

The daemon samples every 60 s here, so every change seen within the test's
deadlines came from an event: a pidfd reporting an exit, the watcher
reporting a receipt or a store write.
"""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import msgspec
import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import Sleepers
from helpers.waits import ChildOutput, wait_until

from capsule_client import AsyncClient, Client, Subscription
from capsule_client.cli.main import main as capsulectl
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot, Session, SessionsChanged
from capsuled.discovery.subscriptions import MAX_PER_CONNECTION, MAX_UNDELIVERED
from capsuled.processes.exits import pidfds_supported

QUIET_SAMPLING = ["--sample-interval", "60"]
DEADLINE_S = 5.0


@pytest.fixture
def quiet_daemon(short_dir: Path) -> Iterator[DaemonProcess]:
    """A real capsuled that samples only every 60 s, on a fresh home."""
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    (home / "runtime/exec-processes").mkdir(mode=0o700, parents=True)
    with DaemonProcess(home, short_dir / "d.sock", QUIET_SAMPLING) as process:
        yield process


def own(home: Path, session_id: str, execs: list[str]) -> None:
    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id, context_id=f"ctx_{session_id}")
        for exec_id in execs:
            store.register_exec(exec_id, session_id)


class View:
    """The answer as a subscriber rebuilds it from ``sessions.changed`` notifications."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.sessions: dict[str, Session] = {}
        self.seen: list[SessionsChanged] = []

    def apply(self, change: SessionsChanged) -> None:
        if change.full:
            self.sessions = {}
        for session in [*change.added, *change.changed]:
            self.sessions[session.session_id] = session
        for session_id in change.removed:
            self.sessions.pop(session_id, None)
        self.seen.append(change)

    def pids(self) -> dict[str, list[int]]:
        return {k: sorted(p.pid for p in s.processes) for k, s in self.sessions.items()}

    def until(self, predicate: Callable[[View], bool], timeout_s: float = DEADLINE_S) -> float:
        """Apply changes until ``predicate`` holds; returns when (monotonic) it did."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out; the subscriber sees {self.pids()}")
            self.apply(self.subscription.next(timeout_s=remaining))
        return time.monotonic()


def line_reader(sock: socket.socket) -> Callable[[float], dict[str, object]]:
    """Read one JSON-RPC message at a time from a raw socket, with a timeout."""
    buffer = bytearray()

    def read(timeout_s: float = DEADLINE_S) -> dict[str, object]:
        sock.settimeout(timeout_s)
        while b"\n" not in buffer:
            chunk = sock.recv(65536)
            assert chunk, "the daemon closed the connection"
            buffer.extend(chunk)
        end = buffer.index(b"\n")
        line = bytes(buffer[:end])
        del buffer[: end + 1]
        message: dict[str, object] = json.loads(line)
        return message

    return read


def raw_connection(daemon: DaemonProcess) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(daemon.socket_path))
    return sock


def send(sock: socket.socket, request_id: int, method: str, params: object = None) -> None:
    message: dict[str, object] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    sock.sendall(json.dumps(message).encode() + b"\n")


@pytest.mark.skipif(not pidfds_supported(), reason="process exits are events only with pidfds")
def test_an_exit_reaches_a_subscriber_within_a_second(
    quiet_daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = quiet_daemon.home
    keep, doomed = pool.start(), pool.start()
    own(home, "ses_a", ["exe_keep", "exe_doomed"])
    write_exec_receipt(home, "exe_keep", keep.pid, command="sleep 300")
    write_exec_receipt(home, "exe_doomed", doomed.pid, command="sleep 300")
    with Client(quiet_daemon.socket_path) as client, client.subscribe() as changes:
        view = View(changes)
        view.until(lambda v: v.pids() == {"ses_a": sorted([keep.pid, doomed.pid])})
        with Client(quiet_daemon.socket_path) as other:
            status = other.status()
        assert status.exit_watch == "pidfd"
        assert status.pidfds >= 2
        pool.kill(doomed)
        killed_at = time.monotonic()
        seen_at = view.until(lambda v: v.pids() == {"ses_a": [keep.pid]})
        assert seen_at - killed_at < 1.0
        pool.kill(keep)
        view.until(lambda v: v.pids() == {})
        assert view.seen[-1].removed == ["ses_a"]


def test_a_new_receipt_reaches_a_subscriber(quiet_daemon: DaemonProcess, pool: Sleepers) -> None:
    home = quiet_daemon.home
    process = pool.start()
    with Client(quiet_daemon.socket_path) as client, client.subscribe() as changes:
        view = View(changes)
        first = changes.next(timeout_s=DEADLINE_S)
        view.apply(first)
        assert first.full and first.added == [] and first.discovery == "ready"
        own(home, "ses_new", ["exe_new"])
        written_at = time.monotonic()
        write_exec_receipt(home, "exe_new", process.pid, command="sleep 300")
        seen_at = view.until(lambda v: v.pids() == {"ses_new": [process.pid]})
        assert seen_at - written_at < 1.0
        change = view.seen[-1]
        assert not change.full and [s.session_id for s in change.added] == ["ses_new"]
        assert change.added[0].context_id == "ctx_ses_new"


def test_a_long_poll_returns_on_a_change_and_waits_out_no_change(
    quiet_daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = quiet_daemon.home
    process = pool.start()
    own(home, "ses_p", ["exe_p"])
    with Client(quiet_daemon.socket_path) as client:
        before = wait_until(
            lambda: not (s := client.snapshot(max_age_ms=0)).gaps and s, message="the store"
        )
        started = time.monotonic()
        unchanged = client.snapshot(since=before.generation, timeout_ms=300)
        assert unchanged.generation == before.generation
        assert time.monotonic() - started >= 0.3
        answers: list[ActiveSessionsSnapshot] = []

        def long_poll() -> None:
            with Client(quiet_daemon.socket_path) as poller:
                answers.append(poller.snapshot(since=before.generation, timeout_ms=20000))

        poll = threading.Thread(target=long_poll)
        started = time.monotonic()
        poll.start()
        # The change must come while the poll waits, or the wake-up goes untested.
        wait_until(lambda: client.status().long_polls == 1, message="the long poll to wait")
        write_exec_receipt(home, "exe_p", process.pid)
        poll.join(timeout=DEADLINE_S)
        assert not poll.is_alive(), "the long poll did not return on the change"
        assert time.monotonic() - started < DEADLINE_S
        (answer,) = answers
        assert answer.generation > before.generation
        assert [s.session_id for s in answer.sessions] == ["ses_p"]


def test_the_generation_does_not_grow_when_nothing_changes(
    quiet_daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = quiet_daemon.home
    process = pool.start()
    own(home, "ses_g", ["exe_g"])
    write_exec_receipt(home, "exe_g", process.pid)
    with Client(quiet_daemon.socket_path) as client:
        settled = wait_until(
            lambda: (s := client.snapshot(max_age_ms=0)).sessions and s,
            message="the session",
        )
        observations = client.status().totals.observations
        generations = {client.snapshot(max_age_ms=0).generation for _ in range(5)}
        client.rescan()
        generations.add(client.snapshot(max_age_ms=0).generation)
        assert generations == {settled.generation}
        assert client.status().totals.observations >= observations + 6


def test_unsubscribe_stops_the_notifications(quiet_daemon: DaemonProcess, pool: Sleepers) -> None:
    home = quiet_daemon.home
    process = pool.start()
    with raw_connection(quiet_daemon) as sock, Client(quiet_daemon.socket_path) as client:
        read = line_reader(sock)
        send(sock, 1, "sessions.subscribe")
        reply = read(DEADLINE_S)
        subscription = reply["result"]["subscription"]  # type: ignore[index]
        first = read(DEADLINE_S)
        assert first["method"] == "sessions.changed"
        assert first["params"]["full"] is True  # type: ignore[index]
        send(sock, 2, "sessions.unsubscribe", {"subscription": subscription})
        assert read(DEADLINE_S) == {"jsonrpc": "2.0", "id": 2, "result": {"unsubscribed": True}}
        before = client.snapshot().generation
        own(home, "ses_u", ["exe_u"])
        write_exec_receipt(home, "exe_u", process.pid)
        changed = client.snapshot(since=before, timeout_ms=5000)
        assert changed.generation > before, "the change was not observed and published"
        with client.subscribe() as changes:  # and reaches a subscriber that is still there
            View(changes).until(lambda v: "ses_u" in v.sessions)
        send(sock, 3, "ping")
        assert read(DEADLINE_S)["id"] == 3  # nothing came between
        send(sock, 4, "sessions.unsubscribe", {"subscription": subscription})
        assert read(DEADLINE_S)["result"] == {"unsubscribed": False}


def test_a_subscription_ends_with_its_connection(quiet_daemon: DaemonProcess) -> None:
    with Client(quiet_daemon.socket_path) as client:
        with raw_connection(quiet_daemon) as sock:
            read = line_reader(sock)
            send(sock, 1, "sessions.subscribe")
            assert "subscription" in read(DEADLINE_S)["result"]  # type: ignore[operator]
            assert client.status().subscriptions == 1
        wait_until(lambda: client.status().subscriptions == 0, message="the subscription to end")


def test_a_subscriber_that_does_not_read_is_dropped_and_others_go_on(
    quiet_daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = quiet_daemon.home
    process = pool.start()
    # A full answer far larger than a socket buffer: 64 sessions of 8 KiB commands.
    sessions = [f"ses_{i:02d}" for i in range(64)]
    with OwnershipStore(store_path(home)) as store:
        for session_id in sessions:
            store.register_session(session_id, context_id=None)
            store.register_exec(f"exe_{session_id}", session_id)
    for session_id in sessions:
        write_exec_receipt(home, f"exe_{session_id}", process.pid, command="x" * 8192)
    with Client(quiet_daemon.socket_path) as client:
        wait_until(lambda: len(client.snapshot(max_age_ms=0).sessions) == 64, message="sessions")
        rss_before = _rss(quiet_daemon.pid)
        with raw_connection(quiet_daemon) as slow, client.subscribe() as healthy_changes:
            healthy = View(healthy_changes)
            healthy.until(lambda v: len(v.sessions) == 64)
            send(slow, 1, "sessions.subscribe")  # and read nothing for now
            wait_until(lambda: client.status().subscriptions == 2, message="the slow subscriber")
            with Client(quiet_daemon.socket_path) as poller:
                generation = poller.snapshot().generation
                for round_ in range(MAX_UNDELIVERED + 4):
                    write_exec_receipt(home, "exe_ses_00", process.pid, command=f"round {round_}")
                    generation = poller.snapshot(since=generation, timeout_ms=5000).generation
                    healthy.until(lambda v, r=round_: _command(v, "ses_00") == f"round {r}")
            status = client.status()
            assert status.totals.subscriptions_dropped == 1
            assert status.subscriptions == 1  # the healthy one
            assert _rss(quiet_daemon.pid) - rss_before < 32 * 1024 * 1024
            # The slow reader now reads: the reply, the one notification that
            # was being sent, then sessions.dropped; nothing was queued.
            read = line_reader(slow)
            reply = read(DEADLINE_S)
            subscription = reply["result"]["subscription"]  # type: ignore[index]
            methods = []
            while not methods or methods[-1] != "sessions.dropped":
                message = read(DEADLINE_S)
                methods.append(message["method"])
                assert message["params"]["subscription"] == subscription  # type: ignore[index]
            assert methods == ["sessions.changed", "sessions.dropped"]
            send(slow, 2, "ping")
            assert read(DEADLINE_S)["id"] == 2
            # The healthy subscriber saw every round.
            assert _command(healthy, "ses_00") == f"round {MAX_UNDELIVERED + 3}"


def _command(view: View, session_id: str) -> object:
    session = view.sessions.get(session_id)
    return None if session is None else session.processes[0].receipt_command


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@contextmanager
def capsulectl_child(
    socket_path: Path, *args: str
) -> Iterator[tuple[subprocess.Popen[bytes], ChildOutput]]:
    """``capsulectl --socket socket_path *args`` as a child process, and its stdout
    (read with deadlines); killed on the way out if it still runs."""
    command = [sys.executable, "-m", "capsule_client.cli", "--socket", str(socket_path), *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        try:
            assert child.stdout is not None and child.stderr is not None
            yield child, ChildOutput(child.stdout)
        finally:
            if child.poll() is None:
                child.kill()


def test_capsulectl_watch_prints_changes_and_exits_quietly_on_ctrl_c(
    quiet_daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = quiet_daemon.home
    process = pool.start()
    with capsulectl_child(quiet_daemon.socket_path, "watch", "--json") as (watch, output):
        first = output.json(DEADLINE_S)
        assert first["full"] is True and first["discovery"] == "ready"
        own(home, "ses_w", ["exe_w"])
        write_exec_receipt(home, "exe_w", process.pid, command="sleep 300")
        while not (change := output.json(DEADLINE_S))["added"]:
            pass
        assert change["added"][0]["session_id"] == "ses_w"
        assert change["generation"] > first["generation"]
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=DEADLINE_S) == 0
        assert watch.stderr is not None and watch.stderr.read() == b""


def test_capsulectl_top_once_shows_processes_with_cpu_and_memory(
    quiet_daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = quiet_daemon.home
    process = pool.start()
    own(home, "ses_t", ["exe_t"])
    write_exec_receipt(home, "exe_t", process.pid, command="sleep 300")
    with Client(quiet_daemon.socket_path) as client:
        wait_until(lambda: client.snapshot(max_age_ms=0).sessions, message="the session")
        measured = client.snapshot(usage=True)
        (listed,) = measured.sessions[0].processes
        assert isinstance(listed.rss_bytes, int) and listed.rss_bytes > 0
        assert isinstance(listed.cpu_percent, float)
        plain = client.snapshot()
        assert plain.sessions[0].processes[0].rss_bytes is msgspec.UNSET
    out = io.StringIO()
    argv = ["--socket", str(quiet_daemon.socket_path), "top", "--once", "--interval", "0.1"]
    assert capsulectl(argv, out=out) == 0
    text = out.getvalue()
    assert "CPU%" in text and "RSS" in text
    lines = text.splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("ses_t"))
    heading = lines[at].split()  # the session's line: its state and its totals
    assert heading[:2] == ["ses_t", "running"] and heading[2].endswith("%") and heading[3] == "CPU"
    row = lines[at + 1]  # its process
    assert str(process.pid) in row and "sleep 300" in row


def test_shutdown_with_open_subscriptions_is_prompt(quiet_daemon: DaemonProcess) -> None:
    with raw_connection(quiet_daemon) as first, raw_connection(quiet_daemon) as second:
        for sock in (first, second):
            read = line_reader(sock)
            send(sock, 1, "sessions.subscribe")
            assert "subscription" in read(DEADLINE_S)["result"]  # type: ignore[operator]
        started = time.monotonic()
        assert quiet_daemon.stop(signal.SIGTERM) == 0
        assert time.monotonic() - started < 2.0  # not the 5 s drain timeout


def test_capsulectl_status_says_how_exits_are_noticed(quiet_daemon: DaemonProcess) -> None:
    out = io.StringIO()
    assert capsulectl(["--socket", str(quiet_daemon.socket_path), "status"], out=out) == 0
    lines = dict(line.split(":", 1) for line in out.getvalue().splitlines())
    expected = "pidfd events" if pidfds_supported() else "noticed by sampling"
    assert lines["exits"].strip().startswith(expected)
    assert lines["clients"].strip() == "1, 0 subscriptions, 0 long polls waiting"


@pytest.mark.anyio
async def test_the_async_client_iterates_changes(
    quiet_daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = quiet_daemon.home
    process = pool.start()
    async with AsyncClient(quiet_daemon.socket_path) as client:
        async with client.subscribe() as changes:
            with anyio.fail_after(DEADLINE_S):
                first = await anext(changes)
                assert first.full and first.added == []
                own(home, "ses_async", ["exe_async"])
                write_exec_receipt(home, "exe_async", process.pid)
                async for change in changes:
                    if change.added:
                        break
            assert [s.session_id for s in change.added] == ["ses_async"]
            assert (await client.status()).subscriptions == 1
        # Unsubscribed on the way out; the connection serves calls again.
        assert (await client.status()).subscriptions == 0


def test_a_connection_may_hold_a_bounded_number_of_subscriptions(
    quiet_daemon: DaemonProcess,
) -> None:
    with raw_connection(quiet_daemon) as sock:
        read = line_reader(sock)
        ids = set()
        for request_id in range(1, MAX_PER_CONNECTION + 2):
            send(sock, request_id, "sessions.subscribe")
            while (message := read(DEADLINE_S)).get("id") != request_id:
                assert message["method"] == "sessions.changed"  # a first, full notification
            if request_id <= MAX_PER_CONNECTION:
                ids.add(message["result"]["subscription"])  # type: ignore[index]
            else:
                assert message["error"]["code"] == -32002  # type: ignore[index]
        assert len(ids) == MAX_PER_CONNECTION
        send(sock, 99, "sessions.subscribe", {"since": -1})
        while (message := read(DEADLINE_S)).get("id") != 99:
            pass
        assert message["error"]["code"] == -32602  # type: ignore[index]
        assert message["error"]["data"]["param"] == "since"  # type: ignore[index]


def test_capsulectl_watch_outlives_a_daemon_restart(quiet_daemon: DaemonProcess) -> None:
    with capsulectl_child(quiet_daemon.socket_path, "watch", "--json") as (watch, output):
        first = output.json(DEADLINE_S)
        assert first["full"] is True
        assert quiet_daemon.stop(signal.SIGTERM) == 0
        quiet_daemon.start()
        # The watch reconnects and starts over with the whole answer.
        again = output.json(DEADLINE_S)
        assert again["full"] is True and again["subscription"] != first["subscription"]
        assert watch.poll() is None
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=DEADLINE_S) == 0
        assert watch.stderr is not None and b"reconnecting" in watch.stderr.read()


def test_capsulectl_top_outlives_a_daemon_restart(quiet_daemon: DaemonProcess) -> None:
    top_json = ("top", "--json", "--interval", "0.2")
    with capsulectl_child(quiet_daemon.socket_path, *top_json) as (top, output):
        assert top.stderr is not None
        errors = ChildOutput(top.stderr)
        assert output.json(DEADLINE_S)["discovery"] == "ready"
        assert quiet_daemon.stop(signal.SIGTERM) == 0
        stopped_at = time.time()
        quiet_daemon.start()
        errors.wait_for(b"reconnecting", DEADLINE_S)
        # Lines printed before the stop may still wait in the pipe: read on
        # to one the new daemon observed.
        deadline = time.monotonic() + DEADLINE_S
        while (line := output.json(deadline - time.monotonic()))["observed_at"] < stopped_at:
            pass
        assert line["discovery"] == "ready"
        assert top.poll() is None
        top.send_signal(signal.SIGINT)
        assert top.wait(timeout=DEADLINE_S) == 0
