"""The real daemon as a service: one per socket, activation, sd_notify, peers, home.

The rules are docs/design.md §8.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess, answers_ping, bind_notify_socket, raw_exchange
from helpers.waits import wait_until

from capsule_client import Client, RemoteError
from capsule_client.kit.paths import lock_path_for

PING = b'{"jsonrpc":"2.0","id":7,"method":"ping"}\n'
STATUS = b'{"jsonrpc":"2.0","id":8,"method":"status"}\n'
NOBODY = 65534
IS_ROOT = os.geteuid() == 0


#: The console script a service manager runs (``ExecStart=capsuled``).
CONSOLE_SCRIPT = Path(sys.executable).parent / "capsuled"


class WrappedDaemon(DaemonProcess):
    """The real daemon started through a wrapper command (a launcher, a sandbox).

    With ``script=True`` it runs the installed ``capsuled`` console script
    instead of ``python -m capsuled``.
    """

    def __init__(
        self, prefix: list[str], *args: object, script: bool = False, **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.prefix = prefix
        self.script = script

    @property
    def command(self) -> list[str]:
        command = super().command
        if self.script:
            assert command[:3] == [sys.executable, "-m", "capsuled"]
            command = [str(CONSOLE_SCRIPT), *command[3:]]
        return [*self.prefix, *command]


def status_of(socket_path: Path) -> dict[str, object]:
    reply = json.loads(raw_exchange(socket_path, STATUS))
    result: dict[str, object] = reply["result"]
    return result


def json_logs(daemon: DaemonProcess) -> list[dict[str, object]]:
    return [json.loads(line) for line in daemon.logs().splitlines() if line.startswith("{")]


@pytest.fixture
def home(short_dir: Path) -> Path:
    path = short_dir / "home"
    path.mkdir(mode=0o700)
    return path


# --------------------------------------------------------------------------
# One daemon per socket


def test_a_second_daemon_exits_1_naming_the_first(daemon: DaemonProcess) -> None:
    inode = os.lstat(daemon.socket_path).st_ino
    assert lock_path_for(daemon.socket_path).read_text() == f"{daemon.pid}\n"
    second = DaemonProcess(daemon.home, daemon.socket_path).start(wait=False)
    assert second.process is not None
    assert second.process.wait(timeout=30) == 1
    assert f"pid {daemon.pid}" in second.logs()
    assert "already running" in second.logs()
    assert os.lstat(daemon.socket_path).st_ino == inode
    assert answers_ping(daemon.socket_path)


def test_the_socket_of_a_killed_daemon_is_replaced(home: Path, short_dir: Path) -> None:
    sock = short_dir / "k.sock"
    with DaemonProcess(home, sock) as first:
        assert first.process is not None
        first.process.kill()
        first.process.wait(timeout=10)
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)  # left behind, nobody listening
    assert not answers_ping(sock)
    with DaemonProcess(home, sock) as second:
        assert status_of(sock)["pid"] == second.pid
        assert lock_path_for(sock).read_text() == f"{second.pid}\n"
        assert "replacing stale socket" in second.logs()
        assert second.stop() == 0


def test_a_directory_at_the_socket_path_is_refused_and_kept(home: Path, short_dir: Path) -> None:
    sock = short_dir / "dir.sock"
    sock.mkdir()
    (sock / "keep").write_text("data")
    daemon = DaemonProcess(home, sock).start(wait=False)
    assert daemon.process is not None
    assert daemon.process.wait(timeout=30) == 1
    assert (sock / "keep").read_text() == "data"
    assert f"{sock} exists and is a directory" in daemon.logs()


def test_daemons_started_at_the_same_instant_leave_exactly_one_serving(
    home: Path, short_dir: Path
) -> None:
    sock = short_dir / "race.sock"
    contenders = [DaemonProcess(home, sock) for _ in range(4)]
    for contender in contenders:
        contender.log_path = short_dir / f"race-{id(contender)}.log"
        contender.start(wait=False)
    try:

        def losers() -> list[DaemonProcess]:
            return [c for c in contenders if c.process is not None and c.process.poll() == 1]

        wait_until(lambda: len(losers()) == 3, timeout_s=20, message="three daemons to give up")
        [winner] = [c for c in contenders if c not in losers()]
        wait_until(lambda: answers_ping(sock), message="the winner to serve")
        assert status_of(sock)["pid"] == winner.pid
        for loser in losers():
            assert f"pid {winner.pid}" in loser.logs()
        assert winner.stop() == 0
    finally:
        for contender in contenders:
            contender.__exit__(None, None, None)


# --------------------------------------------------------------------------
# Socket activation


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate missing"
)
@pytest.mark.parametrize("configured", ["same", "elsewhere"])
def test_socket_activation_serves_the_passed_socket_and_leaves_it(
    home: Path, short_dir: Path, configured: str
) -> None:
    """``systemd-socket-activate -l PATH capsuled …``: the passed socket wins over ``--socket``."""
    if not CONSOLE_SCRIPT.exists():
        pytest.skip("the capsuled console script is not installed beside this Python")
    sock = short_dir / "act.sock"
    configured_path = sock if configured == "same" else short_dir / "other.sock"
    activate = ["systemd-socket-activate", "-l", str(sock)]
    daemon = WrappedDaemon(activate, home, configured_path, script=True).start(wait=False)
    daemon.socket_path = sock  # where clients connect
    try:
        wait_until(sock.exists, message="systemd-socket-activate to listen")
        inode = os.lstat(sock).st_ino
        daemon.wait_ready()  # the first connection starts the daemon
        status = status_of(sock)
        assert status["socket"] == str(sock)
        assert status["pid"] == daemon.pid  # systemd-socket-activate execs the daemon
        assert lock_path_for(sock).read_text() == f"{daemon.pid}\n"
        assert not (short_dir / "other.sock").exists()
        logs = json_logs(daemon)
        assert any(e.get("socket_activated") is True for e in logs), logs
        assert daemon.stop(signal.SIGTERM) == 0
        # systemd's socket: neither unlinked nor re-created by the daemon.
        assert os.lstat(sock).st_ino == inode
        assert lock_path_for(sock).read_text() == ""
    finally:
        daemon.__exit__(None, None, None)


# --------------------------------------------------------------------------
# sd_notify


class NotifyReceiver:
    """A real datagram socket standing in for systemd's notification socket."""

    def __init__(self, sock: socket.socket, value: str) -> None:
        self.sock = sock
        self.value = value
        self.messages: list[str] = []

    def count(self, line: str) -> int:
        """How many datagrams so far carry ``line``."""
        return sum(line in m.split("\n") for m in self.messages)

    def count_prefix(self, prefix: str) -> int:
        """How many datagrams so far start with ``prefix``."""
        return sum(m.startswith(prefix) for m in self.messages)

    def read_until(self, done: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
        """Read datagrams until ``done()``; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {timeout_s} s: {self.messages}")
            readable, _, _ = select.select([self.sock], [], [], remaining)
            if readable:
                self.messages.append(self.sock.recv(4096).decode())

    def wait_for(self, line: str, times: int = 1, timeout_s: float = 10.0) -> list[str]:
        """Read datagrams until ``times`` of them carry ``line``; return all so far."""
        self.read_until(lambda: self.count(line) >= times, f"{times} x {line!r}", timeout_s)
        return self.messages


@pytest.fixture(params=["path", "abstract"])
def notify_receiver(request: pytest.FixtureRequest, short_dir: Path) -> Iterator[NotifyReceiver]:
    sock, value = bind_notify_socket(request.param, short_dir)
    with sock:
        yield NotifyReceiver(sock, value)


def test_sd_notify_ready_status_watchdog_stopping(
    home: Path, short_dir: Path, notify_receiver: NotifyReceiver
) -> None:
    sock = short_dir / "n.sock"
    env = {"NOTIFY_SOCKET": notify_receiver.value, "WATCHDOG_USEC": "200000"}
    daemon = DaemonProcess(home, sock, args=["--sample-interval", "0.2"], env=env)
    daemon.start(wait=False)
    try:
        messages = notify_receiver.wait_for("READY=1")
        # Before it, at most keep-alives (the watchdog runs from the start).
        *before, ready = messages
        assert set(before) <= {"WATCHDOG=1"}, messages
        # READY=1 comes after the first observation, with the state line.
        assert ready.split("\n") == [
            "READY=1",
            "STATUS=ready: 0 active sessions, 0 unowned processes; watcher native",
        ]
        status = status_of(sock)  # and the daemon serves already
        assert status["last_observed_at"] is not None
        # A state change is announced: the ownership store becomes unreadable...
        (home / "capsule.db").write_bytes(b"not a database" * 100)
        unavailable = "STATUS=unavailable: ownership store"
        notify_receiver.read_until(
            lambda: notify_receiver.count_prefix(unavailable) == 1, unavailable
        )
        # ... and readable again (a missing store means nobody owns anything).
        (home / "capsule.db").unlink()
        notify_receiver.read_until(
            lambda: notify_receiver.count_prefix("STATUS=ready") == 1, "STATUS=ready"
        )
        # WATCHDOG_USEC=200000: a keep-alive every 0.1 s; three more within 5 s.
        notify_receiver.wait_for("WATCHDOG=1", notify_receiver.count("WATCHDOG=1") + 3, 5)
        assert daemon.stop(signal.SIGTERM) == 0
        messages = notify_receiver.wait_for("STOPPING=1", timeout_s=1)
    finally:
        daemon.__exit__(None, None, None)
    statuses = [m for m in messages if m.startswith("STATUS=")]
    # (a transient "scanning" line may come between: the store changed mid-observation)
    assert statuses[0].startswith(unavailable)
    assert statuses[-1] == ready.split("\n")[1]
    assert messages[-1].startswith("STOPPING=1\nSTATUS=shutting down")
    assert sum("READY=1" in m.split("\n") for m in messages) == 1


# --------------------------------------------------------------------------
# Peers


def run_as(uid: int, work: Callable[[], bytes]) -> bytes:
    """Run ``work`` in a child process whose uid and gid are ``uid``; return its bytes."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_end)
            os.setgid(uid)
            os.setuid(uid)
            os.write(write_end, work())
            code = 0
        except BaseException:
            os.write(write_end, traceback.format_exc().encode())  # for the assertion message
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        received = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, received
    return received


def exchange_raw(sock: Path, request: bytes) -> bytes:
    """Send ``request`` and read until the daemon hangs up (no EPIPE, no reset allowed)."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(str(sock))
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


def ping_with_client(sock: Path) -> bytes:
    """What ``capsule_client.Client.ping`` raises, as ``ClassName code``."""
    try:
        with Client(sock, timeout_s=5) as client:
            client.ping()
    except RemoteError as exc:
        return f"{type(exc).__name__} {exc.code}".encode()
    return b"no error"


@pytest.mark.skipif(not IS_ROOT, reason="connecting as another uid needs root")
def test_a_peer_of_another_uid_gets_one_error_line_and_is_disconnected(
    daemon: DaemonProcess,
) -> None:
    # Loosen the file modes on purpose: the peer check must hold on its own.
    os.chmod(daemon.socket_path.parent, 0o755)
    os.chmod(daemon.socket_path, 0o666)
    received = run_as(NOBODY, lambda: exchange_raw(daemon.socket_path, PING + PING))
    lines = received.splitlines()
    assert len(lines) == 1, received
    reply = json.loads(lines[0])
    assert reply["id"] is None
    assert reply["error"]["code"] == -32006
    assert f"peer uid {NOBODY}" in reply["error"]["message"]
    assert "result" not in reply
    assert (
        run_as(NOBODY, lambda: ping_with_client(daemon.socket_path)) == b"PermissionDenied -32006"
    )
    assert answers_ping(daemon.socket_path)  # the daemon's own user is still served
    refused = [e for e in json_logs(daemon) if e.get("event") == "peer of another user refused"]
    assert refused and refused[0]["peer_uid"] == NOBODY


@pytest.mark.skipif(shutil.which("unshare") is None or not IS_ROOT, reason="needs unshare as root")
def test_a_peer_without_a_pid_in_our_namespace_is_served(home: Path, short_dir: Path) -> None:
    """Inside its own pid namespace the daemon reads pid 0 for us: not an error by itself."""
    sock = short_dir / "ns.sock"
    with WrappedDaemon(["unshare", "--pid", "--kill-child"], home, sock) as daemon:
        assert status_of(sock)["pid"] == 1  # the daemon is pid 1 of its namespace
        assert answers_ping(sock)
        assert not any(str(e.get("event")).startswith("peer") for e in json_logs(daemon))


# --------------------------------------------------------------------------
# The home (docs/design.md §3)


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_a_home_open_to_others_is_refused_with_the_fix(short_dir: Path, mode: int) -> None:
    home = short_dir / "open"
    home.mkdir()
    os.chmod(home, mode)
    daemon = DaemonProcess(home, short_dir / "h.sock").start(wait=False)
    assert daemon.process is not None
    assert daemon.process.wait(timeout=30) == 1
    assert f"chmod 0700 {home}" in daemon.logs()
    assert not (short_dir / "h.sock").exists()  # refused before the socket was touched


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_a_home_of_another_user_is_refused(short_dir: Path) -> None:
    home = short_dir / "theirs"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    daemon = DaemonProcess(home, short_dir / "o.sock").start(wait=False)
    assert daemon.process is not None
    assert daemon.process.wait(timeout=30) == 1
    assert f"owned by uid {NOBODY}" in daemon.logs()


# --------------------------------------------------------------------------
# Signals and logs


def totals_of(socket_path: Path) -> dict[str, int]:
    totals = status_of(socket_path)["totals"]
    assert isinstance(totals, dict)
    return totals


def test_sighup_schedules_a_rescan_and_the_daemon_serves_on(home: Path, short_dir: Path) -> None:
    sock = short_dir / "hup.sock"
    with DaemonProcess(home, sock, args=["--sample-interval", "0.1"]) as daemon:
        assert daemon.process is not None
        wait_until(lambda: status_of(sock)["discovery"] == "ready", message="the first answer")
        before = totals_of(sock)["rescans"]
        daemon.process.send_signal(signal.SIGHUP)
        # The next observation walks from scratch.
        wait_until(lambda: totals_of(sock)["rescans"] > before, message="a rescan after SIGHUP")
        assert any(e.get("event") == "SIGHUP: scheduling a rescan" for e in json_logs(daemon))
        assert answers_ping(sock)
        assert daemon.stop(signal.SIGTERM) == 0


def test_console_logs_on_a_terminal_even_with_an_inherited_journal_stream(
    home: Path, short_dir: Path
) -> None:
    main_fd, tty_fd = os.openpty()
    sock = short_dir / "tty.sock"
    command = [sys.executable, "-m", "capsuled", "--home", str(home), "--socket", str(sock)]
    env = {**os.environ, "JOURNAL_STREAM": "8:12345"}  # a terminal's shell inherited it
    env.pop("CAPSULED_LOG_FORMAT", None)
    proc = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=tty_fd, stderr=tty_fd, env=env
    )
    os.close(tty_fd)
    try:
        wait_until(lambda: answers_ping(sock), timeout_s=10, message="the daemon to serve")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        output = b""
        while select.select([main_fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            output += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main_fd)
    text = output.decode(errors="replace")
    assert "capsuled ready" in text
    assert not any(line.lstrip().startswith("{") for line in text.splitlines()), text


def test_json_logs_when_stderr_is_not_a_terminal(home: Path, short_dir: Path) -> None:
    sock = short_dir / "j.sock"
    env = {"JOURNAL_STREAM": "8:12345"}
    with DaemonProcess(home, sock, args=["--log-format", "auto"], env=env) as daemon:
        assert daemon.stop() == 0
    lines = [line for line in daemon.logs().splitlines() if line.strip()]
    assert lines and all(json.loads(line)["event"] for line in lines)


# --------------------------------------------------------------------------
# Sandboxing the unit asks for

MDWE_WRAPPER = """
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE
    sys.exit(77)
os.execv(sys.argv[1], sys.argv[1:])
"""


def mdwe_supported() -> bool:
    probe = [sys.executable, "-c", MDWE_WRAPPER, "/bin/true"]
    return sys.platform.startswith("linux") and subprocess.run(probe, check=False).returncode == 0


def test_the_daemon_serves_with_memory_deny_write_execute(home: Path, short_dir: Path) -> None:
    """What ``MemoryDenyWriteExecute=yes`` in the unit needs: no W+X mapping, ever."""
    if not mdwe_supported():
        pytest.skip("no PR_SET_MDWE here (Linux >= 6.3)")
    sock = short_dir / "m.sock"
    with WrappedDaemon([sys.executable, "-c", MDWE_WRAPPER], home, sock) as daemon:
        assert answers_ping(sock)
        assert status_of(sock)["watcher"] == "native"  # the Rust notifier runs, too
        assert daemon.stop() == 0
