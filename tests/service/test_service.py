"""The service glue on its own: real files, real sockets, real processes (docs/design.md §3, §8)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest
from helpers.daemon import bind_notify_socket
from helpers.waits import ChildOutput, wait_until

from capsule_client.cli.main import main as capsulectl
from capsule_client.kit import paths
from capsule_client.wire import ActiveSessionsSnapshot, DiscoveryCost, Session, SessionProcess
from capsuled.rpc import activation, lockfile, peers, sockets
from capsuled.rpc.peers import PeerCredentials
from capsuled.service import home_setup, logs, notify
from capsuled.service.notify import Notifier
from capsuled.startup_errors import (
    ActivationError,
    AlreadyRunning,
    ServiceError,
    SocketPathTaken,
    UnsafeHome,
)

NOBODY = 65534
IS_ROOT = os.geteuid() == 0


# --------------------------------------------------------------------------
# The home


def test_missing_home_is_created_0700_with_its_parents(tmp_path: Path) -> None:
    home = tmp_path / "state" / "capsule"
    old_umask = os.umask(0o022)
    try:
        home_setup.ensure_home(home)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE(home.parent.stat().st_mode) == 0o700


def test_existing_strict_home_is_left_as_it_is(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o750)
    os.chmod(home, 0o750)
    home_setup.ensure_home(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o750


@pytest.mark.parametrize(("mode", "who"), [(0o770, "group"), (0o707, "others"), (0o777, "group")])
def test_home_writable_by_others_is_refused_with_the_fix(
    tmp_path: Path, mode: int, who: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, mode)
    with pytest.raises(UnsafeHome) as caught:
        home_setup.ensure_home(home)
    message = str(caught.value)
    assert f"writable by {who}" in message
    assert f"chmod 0700 {home}" in message
    assert stat.S_IMODE(home.stat().st_mode) == mode  # reported, not repaired


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_home_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    with pytest.raises(UnsafeHome) as caught:
        home_setup.check_home(home)
    message = str(caught.value)
    assert f"owned by uid {NOBODY}" in message
    assert f"chmod 0700 {home}" in message


def test_home_that_is_a_file_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("not a directory")
    with pytest.raises(UnsafeHome, match="not a directory"):
        home_setup.ensure_home(home)
    assert home.read_text() == "not a directory"


# --------------------------------------------------------------------------
# The lock file

LOCK_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from capsuled.rpc.lockfile import acquire_socket_lock
    from capsuled.startup_errors import AlreadyRunning
    start_at = float(sys.argv[2])
    while time.time() < start_at:
        pass
    try:
        lock = acquire_socket_lock(Path(sys.argv[1]))
    except AlreadyRunning as exc:
        print("refused", exc.pid, flush=True)
        sys.exit(1)
    print("locked", flush=True)
    sys.stdin.read()
    """
)


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill a helper process, reap it and close its pipes."""
    proc.kill()
    proc.communicate()


def start_lock_holder(socket_path: Path, start_at: float = 0.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(socket_path), str(start_at)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_lock_holds_the_owner_pid_and_refuses_a_second_daemon(short_dir: Path) -> None:
    sock = short_dir / "d.sock"
    holder = start_lock_holder(sock)
    try:
        assert holder.stdout is not None
        assert ChildOutput(holder.stdout).line() == b"locked"
        assert paths.lock_path_for(sock).read_text() == f"{holder.pid}\n"
        with pytest.raises(AlreadyRunning) as caught:
            lockfile.acquire_socket_lock(sock)
        assert caught.value.pid == holder.pid
        assert f"pid {holder.pid}" in str(caught.value)
    finally:
        stop(holder)


def test_lock_of_a_killed_daemon_is_free_again(short_dir: Path) -> None:
    sock = short_dir / "d.sock"
    holder = start_lock_holder(sock)
    assert holder.stdout is not None
    assert ChildOutput(holder.stdout).line() == b"locked"
    stop(holder)  # SIGKILL: no clean-up ran
    lock = lockfile.acquire_socket_lock(sock)
    try:
        assert paths.lock_path_for(sock).read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()
    assert not lock.held
    assert paths.lock_path_for(sock).read_text() == ""
    lock.release()  # idempotent


def test_lock_taken_at_the_same_instant_has_exactly_one_owner(short_dir: Path) -> None:
    sock = short_dir / "d.sock"
    start_at = time.time() + 1.0  # every contender spins until the same instant
    holders = [start_lock_holder(sock, start_at) for _ in range(6)]
    try:
        lines = []
        for holder in holders:
            assert holder.stdout is not None
            lines.append(ChildOutput(holder.stdout).line().decode().split())
        winners = [h for h, line in zip(holders, lines, strict=True) if line == ["locked"]]
        assert len(winners) == 1
        refused_pids = {line[1] for line in lines if line[0] == "refused"}
        assert refused_pids == {str(winners[0].pid)}
    finally:
        for holder in holders:
            stop(holder)


def test_lock_file_that_is_a_symlink_is_refused(short_dir: Path) -> None:
    sock = short_dir / "d.sock"
    target = short_dir / "precious"
    target.write_text("keep me")
    paths.lock_path_for(sock).symlink_to(target)
    with pytest.raises(ServiceError, match="cannot open the lock file"):
        lockfile.acquire_socket_lock(sock)
    assert target.read_text() == "keep me"


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_lock_file_of_another_user_is_refused(short_dir: Path) -> None:
    sock = short_dir / "d.sock"
    lock_path = paths.lock_path_for(sock)
    lock_path.write_text("")
    os.chown(lock_path, NOBODY, NOBODY)
    with pytest.raises(ServiceError, match="not a regular file owned by"):
        lockfile.acquire_socket_lock(sock)


# --------------------------------------------------------------------------
# The socket


def test_bound_socket_is_0600_in_a_0700_directory_and_serves(short_dir: Path) -> None:
    sock_path = short_dir / "run" / "d.sock"
    sockets.prepare_socket_directory(sock_path)
    assert stat.S_IMODE(sock_path.parent.stat().st_mode) == 0o700
    bound = sockets.bind_unix_socket(sock_path)
    try:
        assert stat.S_IMODE(sock_path.stat().st_mode) == 0o600
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(sock_path))
            conn, _ = bound.sock.accept()
            conn.close()
        assert activation.socket_path_of(bound.sock) == sock_path
    finally:
        bound.sock.close()
    assert sockets.remove_socket(bound)
    assert not sock_path.exists()


def test_stale_socket_is_replaced(short_dir: Path) -> None:
    sock_path = short_dir / "d.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock_path))
    stale.listen()
    stale.close()  # the file stays: a daemon that died without cleaning up
    assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    bound = sockets.bind_unix_socket(sock_path)
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(sock_path))
    finally:
        bound.sock.close()
        sockets.remove_socket(bound)


def test_live_socket_without_a_lock_is_not_replaced(short_dir: Path) -> None:
    sock_path = short_dir / "d.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(sock_path))
    live.listen()
    try:
        inode = os.lstat(sock_path).st_ino
        with pytest.raises(SocketPathTaken, match="accepts connections"):
            sockets.bind_unix_socket(sock_path)
        assert os.lstat(sock_path).st_ino == inode
    finally:
        live.close()


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_non_socket_at_the_socket_path_is_refused_and_kept(short_dir: Path, kind: str) -> None:
    sock_path = short_dir / "d.sock"
    if kind == "file":
        sock_path.write_text("data")
    elif kind == "directory":
        sock_path.mkdir()
        (sock_path / "inside").write_text("data")
    else:
        (short_dir / "target").write_text("data")
        sock_path.symlink_to(short_dir / "target")
    with pytest.raises(SocketPathTaken) as caught:
        sockets.bind_unix_socket(sock_path)
    assert "refusing to replace it" in str(caught.value)
    assert str(sock_path) in str(caught.value)
    if kind == "file":
        assert sock_path.read_text() == "data"
    elif kind == "directory":
        assert (sock_path / "inside").read_text() == "data"
    else:
        assert sock_path.is_symlink()
        assert (short_dir / "target").read_text() == "data"


def test_socket_path_too_long_is_refused_before_binding(short_dir: Path) -> None:
    sock_path = short_dir / ("x" * 120)
    with pytest.raises(ServiceError, match="longer than"):
        sockets.bind_unix_socket(sock_path)
    assert not sock_path.exists()


def test_remove_socket_leaves_a_file_that_replaced_ours(short_dir: Path) -> None:
    sock_path = short_dir / "d.sock"
    bound = sockets.bind_unix_socket(sock_path)
    bound.sock.close()
    os.unlink(sock_path)
    sock_path.write_text("someone else's")
    assert not sockets.remove_socket(bound)
    assert sock_path.read_text() == "someone else's"


def test_open_listener_takes_the_lock_then_the_socket_and_close_undoes_both(
    short_dir: Path,
) -> None:
    sock_path = short_dir / "run" / "d.sock"
    listening = sockets.open_listener(sock_path, environ={})
    try:
        assert not listening.activated
        assert listening.path == sock_path
        assert stat.S_IMODE(sock_path.parent.stat().st_mode) == 0o700
        assert paths.lock_path_for(sock_path).read_text() == f"{os.getpid()}\n"
        inode = os.lstat(sock_path).st_ino
        # A second daemon for the same socket: refused, and the socket is untouched.
        with pytest.raises(AlreadyRunning) as caught:
            sockets.open_listener(sock_path, environ={})
        assert caught.value.pid == os.getpid()
        assert os.lstat(sock_path).st_ino == inode
    finally:
        listening.sock.close()
        listening.close()
    assert not sock_path.exists()
    assert paths.lock_path_for(sock_path).read_text() == ""
    listening.close()  # idempotent


# --------------------------------------------------------------------------
# Socket activation


def test_no_activation_without_the_variables() -> None:
    environ: dict[str, str] = {"PATH": "/bin"}
    assert activation.activated_listener(environ) is None
    assert environ == {"PATH": "/bin"}


def test_activation_meant_for_another_process_is_ignored_and_cleaned() -> None:
    environ = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x"}
    assert activation.activated_listener(environ) is None
    assert environ == {}


def test_malformed_activation_variables_are_an_error() -> None:
    environ = {"LISTEN_PID": "self", "LISTEN_FDS": "1"}
    with pytest.raises(ActivationError, match="not numbers"):
        activation.activated_listener(environ)
    assert environ == {}


ACTIVATED_CHILD = textwrap.dedent(
    """
    import json, os, socket, sys
    from capsuled.rpc import activation, peers
    from capsuled import startup_errors
    try:
        listener = activation.activated_listener()
    except startup_errors.ActivationError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        sys.exit(1)
    conn, _ = listener.accept()
    peer = peers.peer_credentials(conn)
    conn.sendall(json.dumps({
        "path": str(activation.socket_path_of(listener)),
        "peer_pid": peer.pid,
        "peer_uid": peer.uid,
        "env": sorted(k for k in os.environ if k.startswith("LISTEN_")),
        "cloexec": not os.get_inheritable(listener.fileno()),
    }).encode())
    conn.close()
    """
)


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate missing"
)
def test_activated_socket_is_served_and_never_unlinked(short_dir: Path) -> None:
    sock_path = short_dir / "act.sock"
    proc = subprocess.Popen(
        ["systemd-socket-activate", "-l", str(sock_path), sys.executable, "-c", ACTIVATED_CHILD],
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(sock_path.exists)
        inode = os.lstat(sock_path).st_ino
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(sock_path))
            client.settimeout(10)
            reply = json.loads(client.makefile("rb").read())
        assert reply == {
            "path": str(sock_path),
            "peer_pid": os.getpid(),
            "peer_uid": os.geteuid(),
            "env": [],
            "cloexec": True,
        }
        assert os.lstat(sock_path).st_ino == inode  # still systemd's socket
    finally:
        stop(proc)


def test_activation_with_a_non_socket_on_fd_3_is_an_error() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        r, w = os.pipe()
        os.dup2(r, 3)
        os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
        from capsuled.rpc import activation
        from capsuled import startup_errors
        try:
            activation.activated_listener()
        except startup_errors.ActivationError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "not a listening Unix stream socket" in out.stdout or "unusable" in out.stdout


# --------------------------------------------------------------------------
# sd_notify


@pytest.fixture(params=["path", "abstract"])
def notify_socket(
    request: pytest.FixtureRequest, short_dir: Path
) -> Iterator[tuple[str, socket.socket]]:
    """A real datagram socket standing in for systemd's, and its ``NOTIFY_SOCKET`` value."""
    receiver, value = bind_notify_socket(request.param, short_dir)
    receiver.settimeout(5)
    try:
        yield value, receiver
    finally:
        receiver.close()


def test_notifier_sends_each_message_as_one_datagram(
    notify_socket: tuple[str, socket.socket],
) -> None:
    value, receiver = notify_socket
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": value})
    assert notifier.enabled
    try:
        assert notifier.ready("watching\n/home")
        assert receiver.recv(4096) == b"READY=1\nSTATUS=watching /home"
        assert notifier.status("ready: 2 sessions")
        assert receiver.recv(4096) == b"STATUS=ready: 2 sessions"
        assert notifier.watchdog()
        assert receiver.recv(4096) == b"WATCHDOG=1"
        assert notifier.stopping()
        assert receiver.recv(4096) == b"STOPPING=1"
    finally:
        notifier.close()


def test_watchdog_keep_alives_arrive_at_half_the_interval(
    notify_socket: tuple[str, socket.socket],
) -> None:
    value, receiver = notify_socket
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "40000"})
    assert notifier.watchdog_interval_s == 0.02
    received: list[bytes] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(notify.send_watchdog, notifier)
            with anyio.fail_after(5):
                while len(received) < 3:
                    await anyio.wait_readable(receiver)
                    received.append(receiver.recv(4096))
            tg.cancel_scope.cancel()

    started = time.monotonic()
    anyio.run(main)
    elapsed_s = time.monotonic() - started
    notifier.close()
    assert received == [b"WATCHDOG=1"] * 3
    assert 0.035 < elapsed_s < 4  # two intervals of 20 ms passed between three keep-alives


def test_watchdog_off_returns_at_once_and_sends_nothing(
    notify_socket: tuple[str, socket.socket],
) -> None:
    """Notifications on, no ``WATCHDOG_USEC``: no keep-alive is sent, and the task ends."""
    value, receiver = notify_socket
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": value})
    assert notifier.enabled and notifier.watchdog_interval_s is None

    async def main() -> None:
        with anyio.fail_after(1):  # it returns at once, not after an interval
            await notify.send_watchdog(notifier)

    try:
        anyio.run(main)
        assert notifier.ready()  # the next datagram is READY=1: no WATCHDOG=1 came first
        assert receiver.recv(4096).startswith(b"READY=1")
    finally:
        notifier.close()


def test_notifier_without_notify_socket_does_nothing() -> None:
    notifier = Notifier.from_environ({})
    assert not notifier.enabled
    assert not notifier.ready()
    assert notifier.watchdog_interval_s is None


def test_notifier_survives_a_vanished_socket(short_dir: Path) -> None:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(short_dir / "gone")})
    assert notifier.enabled
    assert not notifier.ready()
    assert not notifier.watchdog()
    notifier.close()


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000"}
    assert Notifier.from_environ(env).watchdog_interval_s == 15.0
    env["WATCHDOG_PID"] = str(os.getpid())
    assert Notifier.from_environ(env).watchdog_interval_s == 15.0
    env["WATCHDOG_PID"] = str(os.getpid() + 1)
    assert Notifier.from_environ(env).watchdog_interval_s is None
    assert Notifier.from_environ({"WATCHDOG_USEC": "0"}).watchdog_interval_s is None


# --------------------------------------------------------------------------
# The peer


def test_peer_credentials_of_a_local_peer() -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        peer = peers.peer_credentials(left)
        assert peers.refuse_peer(left) is None
    assert peer == PeerCredentials(pid=os.getpid(), uid=os.geteuid(), gid=os.getegid())


@pytest.mark.skipif(not IS_ROOT, reason="connecting as another uid needs root")
def test_peer_credentials_of_another_uid(short_dir: Path) -> None:
    os.chmod(short_dir, 0o755)
    sock_path = short_dir / "open.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock_path))
    os.chmod(sock_path, 0o666)
    listener.listen()
    listener.settimeout(5)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket(socket.AF_UNIX) as conn:
                conn.connect(str(sock_path))
                conn.recv(1)
            code = 0
        finally:
            os._exit(code)
    try:
        conn, _ = listener.accept()
        with conn:
            peer = peers.peer_credentials(conn)
            assert peer == PeerCredentials(pid=child, uid=NOBODY, gid=NOBODY)
            line = peers.refuse_peer(conn)
    finally:
        listener.close()
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert line is not None
    assert b"\n" not in line  # one message; the server adds the newline
    message = msgspec.json.decode(line)
    assert message["jsonrpc"] == "2.0"
    assert message["id"] is None
    assert message["error"]["code"] == -32006
    assert f"peer uid {NOBODY}" in message["error"]["message"]


PID_NAMESPACE_LISTENER = textwrap.dedent(
    """
    import json, socket, sys
    from capsuled.rpc import peers
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(sys.argv[1])
    listener.listen()
    print("listening", flush=True)
    conn, _ = listener.accept()
    peer = peers.peer_credentials(conn)
    conn.sendall(json.dumps({"pid": peer.pid, "uid": peer.uid}).encode())
    conn.close()
    """
)


@pytest.mark.skipif(shutil.which("unshare") is None or not IS_ROOT, reason="needs unshare as root")
def test_peer_in_another_pid_namespace_has_no_pid(short_dir: Path) -> None:
    sock_path = short_dir / "ns.sock"
    proc = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            sys.executable,
            "-c",
            PID_NAMESPACE_LISTENER,
            str(sock_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert ChildOutput(proc.stdout).line() == b"listening"
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(sock_path))
            client.settimeout(5)
            reply = json.loads(client.makefile("rb").read())
        assert reply == {"pid": None, "uid": os.geteuid()}
    finally:
        stop(proc)


# --------------------------------------------------------------------------
# Logs


def test_journal_stream_is_recognised_only_for_that_very_file(tmp_path: Path) -> None:
    with open(tmp_path / "journal", "wb") as stream, open(tmp_path / "other", "wb") as other:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logs.stderr_is_journal(env, stream.fileno())
        assert not logs.stderr_is_journal(env, other.fileno())
        assert not logs.stderr_is_journal({"JOURNAL_STREAM": "garbage"}, stream.fileno())
        assert not logs.stderr_is_journal({}, stream.fileno())


# --------------------------------------------------------------------------
# The STATUS= line


def snapshot_with(
    discovery: str, sessions: int = 0, unowned: int = 0, gaps: list[str] | None = None
) -> ActiveSessionsSnapshot:
    process = SessionProcess(kind="process", pid=4242, started_at=1_700_000_000)
    return ActiveSessionsSnapshot(
        home="/h",
        observed_at=1.0,
        generation=1,
        task=None,
        discovery=discovery,  # type: ignore[arg-type]
        sessions=[Session(f"ses_{i}", None, [process]) for i in range(sessions)],
        unowned=[process] * unowned,
        servers=[],
        gaps=gaps or [],
        cost=DiscoveryCost(),
    )


def test_status_text_follows_the_discovery_state() -> None:
    assert notify.status_text(None, "native") == (
        "starting: first observation of the home; watcher native"
    )
    assert notify.status_text(snapshot_with("ready", 1, 1), "polling") == (
        "ready: 1 active session, 1 unowned process; watcher polling"
    )
    assert notify.status_text(snapshot_with("ready", 2, 0), "off") == (
        "ready: 2 active sessions, 0 unowned processes; watcher off"
    )
    unavailable = snapshot_with("unavailable", gaps=["store unreadable", "more"])
    assert notify.status_text(unavailable, "native") == "unavailable: store unreadable"
    assert "\n" not in notify.status_text(snapshot_with("scanning"), "native")


def test_capsulectl_names_the_pid_holding_the_lock_of_a_socket_that_is_gone(
    short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = short_dir / "d.sock"
    holder = start_lock_holder(sock)  # holds the lock; no socket at the path
    try:
        assert ChildOutput(holder.stdout).line() == b"locked"
        assert capsulectl(["--socket", str(sock), "status"]) == 3
        err = capsys.readouterr().err
        assert f"but pid {holder.pid}, named in {paths.lock_path_for(sock)}, still runs" in err
        assert "it binds it again within a few seconds" in err
        assert f"`kill {holder.pid}`" in err
    finally:
        stop(holder)
