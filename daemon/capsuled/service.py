"""Running as a service: the lock file, the socket, socket activation, sd_notify,
the home's strictness and the peer's credentials (docs/design.md §3, §8).

Everything here is plain, synchronous system-call glue that the supervisor and
the server call at a few points:

* at start: :func:`ensure_home` (docs/design.md §3 strictness), then :func:`open_listener`:
  the socket systemd passed (:func:`activated_listener`) or a fresh one
  (:func:`prepare_socket_directory`, :func:`acquire_socket_lock` before the
  socket is touched, :func:`bind_unix_socket`, which replaces only a stale
  socket);
* while running: :class:`Notifier` (``READY=1``, ``STATUS=`` from
  :func:`status_text`, ``STOPPING=1``),
  :func:`send_watchdog` (``WATCHDOG=1``) and, per accepted connection,
  :func:`refuse_peer`;
* on the way out: :meth:`Listening.close` (removes only a socket the daemon
  created, then releases the lock).

sd_notify is a few lines over a datagram socket rather than a library: the
maintained wrappers either need libsystemd or swallow every error (docs/design.md §8).

Errors that must stop the daemon from starting are :class:`ServiceError`; the
supervisor turns them into its ``StartupError``, which the entry point logs
before exiting 1. Tree::

    ServiceError
    ├── AlreadyRunning      another daemon holds the socket's lock
    ├── SocketPathTaken     something that is not a stale socket is at the socket path
    ├── UnsafeHome          the home is not a directory of ours, closed to others
    └── ActivationError     systemd passed something we cannot serve
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import struct
import sys
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import anyio
import msgspec
import structlog

from capsule_client.paths import MAX_SOCKET_PATH_BYTES, lock_path_for
from capsule_client.protocol import (
    JSONRPC_VERSION,
    ActiveSessionsSnapshot,
    ErrorObject,
    ErrorResponse,
)
from capsuled.errors import PermissionDenied
from capsuled.home import home_refusal, user_name

__all__ = [
    "ActivationError",
    "AlreadyRunning",
    "BoundSocket",
    "Listening",
    "Notifier",
    "PeerCredentials",
    "ServiceError",
    "SocketLock",
    "SocketMend",
    "SocketPathTaken",
    "UnsafeHome",
    "acquire_socket_lock",
    "activated_listener",
    "bind_unix_socket",
    "check_home",
    "ensure_home",
    "listening_intact",
    "lock_path_for",
    "mend_listening",
    "open_listener",
    "peer_credentials",
    "permission_denied_line",
    "prepare_socket_directory",
    "refuse_peer",
    "remove_socket",
    "send_watchdog",
    "socket_path_of",
    "status_text",
    "stderr_is_journal",
]

_log = structlog.get_logger(__name__)

#: The first file descriptor systemd passes (``SD_LISTEN_FDS_START``, sd_listen_fds(3)).
LISTEN_FDS_START: Final = 3
_ACTIVATION_VARIABLES: Final = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")

#: How long a second daemon waits for the first to write its pid into the lock
#: file when it finds the lock taken but the file still empty.
_LOCK_PID_WAIT_S: Final = 0.5


class ServiceError(Exception):
    """The daemon cannot start; ``str(error)`` says why and what to do."""


class AlreadyRunning(ServiceError):
    """Another daemon holds the lock beside the socket (docs/design.md §8).

    Attributes:
        pid: the running daemon's pid as written in the lock file, or None
            when it could not be read.
        lock_path: the lock file.
    """

    def __init__(self, pid: int | None, lock_path: Path, socket_path: Path) -> None:
        who = f"pid {pid}" if pid is not None else "a process whose pid could not be read"
        super().__init__(
            f"capsuled is already running for {socket_path} ({who}, lock {lock_path}); "
            "stop it first or start this one with another --socket"
        )
        self.pid = pid
        self.lock_path = lock_path


class SocketPathTaken(ServiceError):
    """Something other than a stale socket sits where the socket should be.

    The daemon never deletes a regular file, a directory, a symbolic link, or a
    socket somebody still accepts connections on.
    """


class UnsafeHome(ServiceError):
    """The home is not owned by the daemon's user and closed to others (docs/design.md §3)."""


class ActivationError(ServiceError):
    """``LISTEN_FDS`` was set for us but does not describe one listening Unix stream socket."""


# --------------------------------------------------------------------------
# The home (docs/design.md §3 strictness)


def ensure_home(home: Path) -> None:
    """Create the home if it is missing, then check it (:func:`check_home`).

    A missing home, and any missing parent, is created with mode 0700 (what the
    XDG base directory specification asks for), so that a first start on a
    fresh machine works.

    Raises:
        UnsafeHome: the home cannot be created, or fails :func:`check_home`.
    """
    try:
        _make_private_dirs(home)
    except OSError as exc:
        raise UnsafeHome(f"cannot create the home {home}: {exc.strerror or exc}") from exc
    check_home(home)


def check_home(home: Path) -> None:
    """Refuse a home that another user could write receipts into (docs/design.md §3).

    The home (symbolic links followed) must be a directory, owned by the
    effective uid, with neither the group nor the others write bit; the rule
    and its wording are :func:`capsuled.home.home_refusal`, which the reader
    applies on every observation too.

    Raises:
        UnsafeHome: the home cannot be inspected, or is refused, with a message
            that names the fix (``chmod 0700 …``).
    """
    try:
        st = os.stat(home)
    except OSError as exc:
        raise UnsafeHome(f"cannot use the home {home}: {exc.strerror or exc}") from exc
    refusal = home_refusal(st, home, os.geteuid())
    if refusal is not None:
        raise UnsafeHome(refusal)


def _make_private_dirs(path: Path) -> None:
    """``mkdir -p -m 0700``: directories created here get 0700; existing ones are left alone."""
    missing: list[Path] = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(directory, 0o700)  # the umask may have taken bits we asked for


# --------------------------------------------------------------------------
# One daemon per socket (docs/design.md §8)


def prepare_socket_directory(socket_path: Path) -> None:
    """Create the socket's directory 0700 if it is missing (docs/design.md §8).

    An existing directory (``$XDG_RUNTIME_DIR``, the home) is left as it is.

    Raises:
        ServiceError: the directory cannot be created.
    """
    try:
        _make_private_dirs(socket_path.parent)
    except OSError as exc:
        raise ServiceError(
            f"cannot create the socket's directory {socket_path.parent}: {exc.strerror or exc}"
        ) from exc


class SocketLock:
    """An exclusive ``flock`` on ``<socket>.lock``, with the owner's pid written in it.

    The lock lives as long as the open file description: it goes away when the
    daemon exits, however it exits (``kill -9`` included), so a stale lock
    cannot exist. The file itself is never unlinked: removing it would let a
    later daemon lock a new file at the same path while an earlier one still
    holds the old one.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @property
    def held(self) -> bool:
        """Whether :meth:`release` has not been called yet."""
        return self._fd is not None

    def is_at_its_path(self) -> bool:
        """Whether the file at :attr:`path` is still the one this lock holds.

        False once it was removed or replaced (a clean-up of the directory):
        another daemon could then lock a new file there.
        """
        if self._fd is None:
            return False
        try:
            at_path = os.lstat(self.path)
        except OSError:
            return False
        held = os.fstat(self._fd)
        return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        """Empty the pid and drop the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)  # closing the only descriptor drops the flock

    def release_unlinked(self) -> None:
        """Drop the lock of a file no longer at :attr:`path`, leaving its content. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def acquire_socket_lock(socket_path: Path, *, pid: int | None = None) -> SocketLock:
    """Take the exclusive lock beside ``socket_path`` without waiting.

    Take it before the socket is touched (anyio's ``create_unix_listener`` unlinks
    whatever is at the path). The lock file is opened without following a
    symbolic link and must be a regular file owned by the effective uid.

    Args:
        socket_path: the daemon's socket; its directory must exist.
        pid: the pid to write into the lock file (default: this process's).

    Returns:
        The held lock; keep it until the socket has been removed.

    Raises:
        AlreadyRunning: another process holds the lock; carries its pid.
        ServiceError: the lock file cannot be opened or is not ours.
    """
    path = lock_path_for(socket_path)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW  # non-inheritable by default (PEP 446)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise ServiceError(f"cannot open the lock file {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ServiceError(
                f"the lock file {path} is not a regular file owned by {user_name(os.geteuid())}; "
                "remove it if no capsuled is running"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(_read_lock_pid(fd), path, socket_path) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid() if pid is None else pid}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return SocketLock(fd, path)


def _read_lock_pid(fd: int) -> int | None:
    """The pid the lock's owner wrote, waiting briefly if it has not written it yet."""
    deadline = time.monotonic() + _LOCK_PID_WAIT_S
    while True:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


# --------------------------------------------------------------------------
# The listening socket


@dataclass(frozen=True, slots=True)
class BoundSocket:
    """A listening socket and what :func:`remove_socket` needs to remove only it.

    Attributes:
        sock: the listening socket (blocking mode as created; anyio switches it).
        path: where it is bound.
        device, inode: identity of the socket file right after ``bind``.
    """

    sock: socket.socket
    path: Path
    device: int
    inode: int


def bind_unix_socket(path: Path, *, backlog: int = socket.SOMAXCONN) -> BoundSocket:
    """Bind and listen on ``path`` with mode 0600; call only while holding the lock.

    A socket already at ``path`` is replaced only when nobody accepts
    connections on it (a daemon that died without cleaning up). Anything else
    at the path is refused and left in place. The socket is chmod-ed to 0600
    between ``bind`` and ``listen``, so no peer can connect before the mode is
    right.

    Raises:
        SocketPathTaken: a file, directory, symbolic link or live socket is at ``path``.
        ServiceError: the path is too long, or bind/listen failed.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise ServiceError(
            f"the socket path {path} is longer than {MAX_SOCKET_PATH_BYTES} bytes, "
            "the limit of Unix socket addresses; pass a shorter --socket"
        )
    _clear_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        os.chmod(path, 0o600)
        st = os.stat(path)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ServiceError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    return BoundSocket(sock=sock, path=path, device=st.st_dev, inode=st.st_ino)


def _clear_stale_socket(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathTaken(
            f"{path} exists and is {_file_kind(st.st_mode)}, not a socket; refusing to replace "
            "it. Move it away or pass another --socket"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(os.fspath(path))
    except ConnectionRefusedError:
        pass  # nobody listens: left by a daemon that died
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketPathTaken(
            f"cannot tell whether the socket {path} is still in use ({exc.strerror or exc}); "
            "capsuled will not replace it. Remove it if nothing serves it"
        ) from exc
    else:
        raise SocketPathTaken(
            f"something accepts connections on {path} but holds no capsuled lock "
            "(a systemd capsuled.socket unit?); capsuled will not replace a live socket. "
            "Stop it first or pass another --socket"
        )
    finally:
        probe.close()
    _log.info("replacing stale socket", socket=str(path))
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


def remove_socket(bound: BoundSocket) -> bool:
    """Unlink the socket file if it is still the one :func:`bind_unix_socket` made.

    Never called for an activated socket: that one belongs to systemd.

    Returns:
        True if a file was removed.
    """
    if not _socket_is(bound):
        return False
    try:
        os.unlink(bound.path)
    except FileNotFoundError:
        return False
    return True


# --------------------------------------------------------------------------
# Socket activation (sd_listen_fds(3))


def activated_listener(environ: MutableMapping[str, str] | None = None) -> socket.socket | None:
    """The listening socket systemd passed, or None when not socket-activated.

    Follows sd_listen_fds(3): ``LISTEN_PID`` must equal our pid, ``LISTEN_FDS``
    counts descriptors from 3. ``LISTEN_PID``, ``LISTEN_FDS`` and
    ``LISTEN_FDNAMES`` are removed from the environment in every case, so that
    no child takes them for its own. The descriptor is marked close-on-exec.
    Its file is systemd's: the daemon never unlinks or re-creates it.

    Args:
        environ: the environment to read and clean (default ``os.environ``).

    Raises:
        ActivationError: the variables are malformed, more than one descriptor
            was passed, or fd 3 is not a listening Unix stream socket.
    """
    env = os.environ if environ is None else environ
    listen_pid = env.get("LISTEN_PID")
    listen_fds = env.get("LISTEN_FDS")
    for name in _ACTIVATION_VARIABLES:
        env.pop(name, None)
    if listen_pid is None or listen_fds is None:
        return None
    try:
        pid, count = int(listen_pid), int(listen_fds)
    except ValueError:
        raise ActivationError(
            f"LISTEN_PID={listen_pid!r} / LISTEN_FDS={listen_fds!r} are not numbers"
        ) from None
    if pid != os.getpid() or count == 0:
        return None  # meant for another process (inherited), or nothing passed
    if count != 1:
        raise ActivationError(
            f"systemd passed {count} sockets; capsuled serves exactly one (one ListenStream=)"
        )
    fd = LISTEN_FDS_START
    try:
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ActivationError(f"fd {fd} passed by systemd is unusable: {exc}") from exc
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
        sock.detach()
        raise ActivationError(
            f"fd {fd} passed by systemd is not a listening Unix stream socket "
            "(the .socket unit needs ListenStream= with a path)"
        )
    return sock


def socket_path_of(sock: socket.socket) -> Path | None:
    """The file-system path a Unix socket is bound to, or None (abstract or unnamed)."""
    name = sock.getsockname()
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if not isinstance(name, str) or not name or name.startswith("\0"):
        return None
    return Path(name)


@dataclass(slots=True)
class Listening:
    """The daemon's listening socket, the lock that guards it, and how it came to be.

    Attributes:
        sock: the listening socket, for ``anyio.abc.SocketListener.from_socket``.
        path: the socket's path (for an activated socket, the path systemd bound).
        activated: True when systemd passed the socket: the daemon never
            unlinks it.
        lock: the held lock beside the socket.
        bound: what :func:`remove_socket` needs, when the daemon bound the socket.
    """

    sock: socket.socket
    path: Path
    activated: bool
    lock: SocketLock
    bound: BoundSocket | None = None

    def close(self) -> None:
        """Remove the socket the daemon created, then release the lock. Idempotent.

        In that order: once the lock is free another daemon may bind the path,
        and its socket must not be the one removed. The listening socket itself
        is closed by whoever wrapped it (anyio's listener ``aclose``).
        """
        if self.bound is not None and remove_socket(self.bound):
            _log.debug("socket removed", socket=str(self.path))
        self.bound = None
        self.lock.release()


def open_listener(
    socket_path: Path, *, environ: MutableMapping[str, str] | None = None
) -> Listening:
    """Take the lock and the listening socket: the passed one, else a new bind (docs/design.md §8).

    With socket activation (:func:`activated_listener`) the lock is taken beside
    the socket systemd bound (or beside ``socket_path`` for an abstract one) and
    the socket is left exactly as it is. Otherwise the socket's directory is
    created 0700 if missing, the lock is taken, and only then is the socket
    bound (:func:`bind_unix_socket`).

    Args:
        socket_path: the configured socket path (docs/design.md §2).
        environ: where the activation variables are read and removed
            (default ``os.environ``).

    Raises:
        ServiceError: any of the refusals of this module; nothing was left held.
    """
    activated = activated_listener(environ)
    if activated is not None:
        path = socket_path_of(activated) or socket_path
        try:
            lock = acquire_socket_lock(path)
        except BaseException:
            activated.detach()  # systemd's descriptor: closing it is not ours to decide
            raise
        return Listening(sock=activated, path=path, activated=True, lock=lock)
    prepare_socket_directory(socket_path)
    lock = acquire_socket_lock(socket_path)
    try:
        bound = bind_unix_socket(socket_path)
    except BaseException:
        lock.release()
        raise
    return Listening(sock=bound.sock, path=socket_path, activated=False, lock=lock, bound=bound)


#: What :func:`mend_listening` did or found.
SocketMend = Literal["relocked", "rebound", "foreign", "contested", "taken"]


def mend_listening(listening: Listening) -> list[SocketMend]:
    """Check that the daemon's socket and lock files are still its own; mend what it may.

    For a socket the daemon bound (never one systemd passed), called from
    time to time while it runs. A clean-up of ``/tmp`` or of
    ``$XDG_RUNTIME_DIR`` can remove either file while the daemon runs: the
    socket's removal leaves the daemon unreachable, the lock's lets a second
    daemon start on the same path.

    Returns, in this order, what applied (nothing when both files are intact):

    - ``"taken"``: the lock file was removed or replaced, another process
      holds the lock at its path now (a second daemon started meanwhile), and
      the socket at the path is not this daemon's any more. The path is
      theirs: nothing else is done, and this daemon should stop.
    - ``"contested"``: as ``"taken"``, but this daemon's socket is still at
      the path. A second daemon refuses to start beside a live socket and
      lets its lock go, so nothing is done now: the lock is taken again at a
      later call, once it is free.
    - ``"relocked"``: the lock file was removed or replaced; the lock is taken
      again at its path, with this daemon's pid.
    - ``"rebound"``: the socket file was missing; a socket is bound again at
      its path (under the lock, as at start), and ``listening`` holds it now.
      The caller must serve it and close the old one.
    - ``"foreign"``: something else is at the socket's path (its identity
      changed); it is left alone, as at start.

    Blocking (file-system calls, and a short wait to read a rival's pid):
    run it in a worker thread.

    Raises:
        ServiceError: the directory, the lock or the socket could not be made
            again (the daemon keeps serving the socket it has).
    """
    bound = listening.bound
    if bound is None:
        return []
    done: list[SocketMend] = []
    if not listening.lock.is_at_its_path():
        prepare_socket_directory(bound.path)
        try:
            fresh = acquire_socket_lock(bound.path)
        except AlreadyRunning:
            return ["contested"] if _socket_is(bound) else ["taken"]
        listening.lock.release_unlinked()
        listening.lock = fresh
        done.append("relocked")
    if not os.path.lexists(bound.path):
        prepare_socket_directory(bound.path)
        listening.bound = bind_unix_socket(bound.path)
        listening.sock = listening.bound.sock
        done.append("rebound")
    elif not _socket_is(bound):
        done.append("foreign")
    return done


def listening_intact(listening: Listening) -> bool:
    """Whether the socket and lock files are both still the daemon's own.

    Two ``stat`` calls: cheap enough for the event loop, so that the socket
    check of an idle daemon costs no worker-thread round trip; only when this
    says no does :func:`mend_listening` run (in a worker thread).
    """
    bound = listening.bound
    return bound is None or (listening.lock.is_at_its_path() and _socket_is(bound))


def _socket_is(bound: BoundSocket) -> bool:
    """Whether the file at ``bound.path`` is still the socket :func:`bind_unix_socket` made
    (a socket with its device and inode: an inode number may be reused)."""
    try:
        st = os.lstat(bound.path)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == (bound.device, bound.inode)


# --------------------------------------------------------------------------
# sd_notify (sd_notify(3))


class Notifier:
    """Sends sd_notify(3) messages to ``$NOTIFY_SOCKET``; does nothing without one.

    A datagram socket, a few lines (docs/design.md §8 records this exception to "use a
    library"). Send errors never stop the daemon: the first one of each kind is
    logged at warning, repeats at debug.

    Attributes:
        address: where messages go (``@name`` already turned into ``\\0name``),
            or None when disabled.
        watchdog_interval_s: half of ``$WATCHDOG_USEC`` in seconds when the
            watchdog is on for this process, else None.
    """

    def __init__(self, address: str | None, *, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_interval_s = watchdog_usec / 2_000_000 if watchdog_usec else None
        self._sock: socket.socket | None = None
        self._failed: set[int] = set()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """Read ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``.

        ``NOTIFY_SOCKET`` may be an absolute path or ``@name`` for the abstract
        namespace; anything else (e.g. ``vsock:``) disables notification with a
        warning. The watchdog is on when ``WATCHDOG_USEC`` is a positive integer
        and ``WATCHDOG_PID``, if set, is our pid (sd_watchdog_enabled(3)).
        """
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET") or None
        address: str | None = None
        if raw is not None:
            if raw.startswith("@"):
                address = "\0" + raw[1:]
            elif raw.startswith("/"):
                address = raw
            else:
                _log.warning("NOTIFY_SOCKET not supported; not notifying", notify_socket=raw)
        watchdog_usec: int | None = None
        usec, wd_pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID")
        if usec.isdigit() and int(usec) > 0 and (wd_pid is None or wd_pid == str(os.getpid())):
            watchdog_usec = int(usec)
        return cls(address, watchdog_usec=watchdog_usec)

    @property
    def enabled(self) -> bool:
        """Whether there is somewhere to send to."""
        return self.address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``VAR=value`` assignments as one datagram.

        Returns:
            True if the datagram was sent; False when disabled or the send failed.
        """
        if self.address is None or not assignments:
            return False
        message = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)  # never stall the event loop
            self._sock.sendto(message, self.address)
        except OSError as exc:
            code = exc.errno or 0
            level = _log.debug if code in self._failed else _log.warning
            self._failed.add(code)
            level("sd_notify failed", error=str(exc), message=message.decode())
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1`` (with a ``STATUS=`` line if given): start-up is complete."""
        return self.notify("READY=1", *([_status_line(status)] if status else []))

    def status(self, status: str) -> bool:
        """``STATUS=…``: one line shown by ``systemctl status``."""
        return self.notify(_status_line(status))

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: the event loop is alive."""
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: shutdown has begun."""
        return self.notify("STOPPING=1", *([_status_line(status)] if status else []))

    def close(self) -> None:
        """Close the datagram socket. Idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status_line(status: str) -> str:
    return "STATUS=" + " ".join(status.split())


def status_text(snapshot: ActiveSessionsSnapshot | None, watcher_mode: str) -> str:
    """The one ``STATUS=`` line ``systemctl status`` shows for the daemon.

    Args:
        snapshot: the latest observation's answer, None before the first.
        watcher_mode: ``native``, ``polling`` or ``off``.

    Returns:
        e.g. ``"ready: 2 active sessions, 1 unowned process; watcher native"``,
        or ``"unavailable: <the first gap>"``.
    """
    if snapshot is None:
        return f"starting: first observation of the home; watcher {watcher_mode}"
    if snapshot.discovery == "unavailable":
        reason = snapshot.gaps[0] if snapshot.gaps else "no reason given"
        return f"unavailable: {reason}"
    sessions, unowned = len(snapshot.sessions), len(snapshot.unowned)
    return (
        f"{snapshot.discovery}: {sessions} active session{'' if sessions == 1 else 's'}, "
        f"{unowned} unowned process{'' if unowned == 1 else 'es'}; watcher {watcher_mode}"
    )


async def send_watchdog(notifier: Notifier) -> None:
    """Send ``WATCHDOG=1`` every :attr:`Notifier.watchdog_interval_s` until cancelled.

    Returns at once when the watchdog is off. Runs on the event loop, so a loop
    blocked for longer than ``WatchdogSec`` stops the keep-alives and systemd
    restarts the daemon (docs/design.md §8).
    """
    interval_s = notifier.watchdog_interval_s
    if interval_s is None:
        return
    while True:
        notifier.watchdog()
        await anyio.sleep(interval_s)


# --------------------------------------------------------------------------
# The peer (docs/design.md §8, error -32006)


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """Who is at the other end of a Unix stream socket.

    Attributes:
        pid: the peer's pid, or None when the kernel does not say (0 from
            ``SO_PEERCRED`` for a peer in another pid namespace; macOS without
            ``LOCAL_PEERPID``). An unknown pid is not an error by itself.
        uid: the peer's effective uid at ``connect`` time.
        gid: its effective gid, or None where not reported.
    """

    pid: int | None
    uid: int
    gid: int | None


_UCRED: Final = struct.Struct("iII")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
_XUCRED: Final = struct.Struct(
    "IIh16I"
)  # struct xucred {u_int cr_version; uid_t; short; gid_t[16]}
_SOL_LOCAL: Final = 0
_LOCAL_PEERCRED: Final[int] = getattr(socket, "LOCAL_PEERCRED", 0x001)
_LOCAL_PEERPID: Final[int] = getattr(socket, "LOCAL_PEERPID", 0x002)


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """Read the peer's credentials from a connected Unix stream socket.

    Linux: ``SO_PEERCRED``; macOS and the BSDs: ``LOCAL_PEERCRED`` (plus
    ``LOCAL_PEERPID`` on macOS for the pid).

    Raises:
        OSError: the kernel refused (for example the peer already hung up on
            some systems); treat the peer as not allowed.
    """
    if hasattr(socket, "SO_PEERCRED"):
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        pid, uid, gid = _UCRED.unpack(raw)
        return PeerCredentials(pid=pid if pid > 0 else None, uid=uid, gid=gid)
    raw = sock.getsockopt(_SOL_LOCAL, _LOCAL_PEERCRED, _XUCRED.size)
    _version, uid, ngroups, *groups = _XUCRED.unpack(raw[: _XUCRED.size])
    peer_pid: int | None = None
    if sys.platform == "darwin":
        try:
            peer_pid = int.from_bytes(sock.getsockopt(_SOL_LOCAL, _LOCAL_PEERPID, 4), sys.byteorder)
        except OSError:
            peer_pid = None
    return PeerCredentials(pid=peer_pid or None, uid=uid, gid=groups[0] if ngroups > 0 else None)


_error_encoder = msgspec.json.Encoder()


def permission_denied_line(peer: PeerCredentials | None, daemon_uid: int | None = None) -> bytes:
    """The one error line (-32006, ``id`` null) a refused peer gets (docs/design.md §7).

    Args:
        peer: the peer's credentials, or None when they could not be read.
        daemon_uid: the uid the peer was compared with (default: the effective uid).

    Returns:
        A JSON-RPC error response, one message without its ``\\n`` (the server
        frames it, as it does every reply).
    """
    uid = os.geteuid() if daemon_uid is None else daemon_uid
    if peer is None:
        error = PermissionDenied("permission denied: the peer's credentials could not be read")
    else:
        error = PermissionDenied(
            f"permission denied: peer uid {peer.uid} is not the daemon's uid {uid}",
            {"peer_uid": peer.uid, "daemon_uid": uid},
        )
    response = ErrorResponse(
        jsonrpc=JSONRPC_VERSION,
        id=None,
        error=ErrorObject(code=error.code, message=error.message, data=error.data),
    )
    return _error_encoder.encode(response)


def refuse_peer(raw_socket: socket.socket) -> bytes | None:
    """The line to send before hanging up on a peer that is not the daemon's user, else None.

    A peer whose credentials cannot be read is refused as well. A peer whose pid
    is unknown (another pid namespace) is judged by its uid alone.

    Args:
        raw_socket: the accepted connection (``SocketAttribute.raw_socket``).

    Returns:
        The -32006 error line (:func:`permission_denied_line`), or None when the
        peer may talk to the daemon.
    """
    try:
        peer = peer_credentials(raw_socket)
    except OSError as exc:
        _log.warning("peer credentials unreadable; refusing the connection", error=str(exc))
        return permission_denied_line(None)
    if peer.uid == os.geteuid():
        return None
    _log.warning("peer of another user refused", peer_uid=peer.uid, peer_pid=peer.pid)
    return permission_denied_line(peer)


# --------------------------------------------------------------------------
# Logs


def stderr_is_journal(environ: Mapping[str, str] | None = None, fd: int = 2) -> bool:
    """Whether ``fd`` is the stream systemd connected to the journal.

    ``$JOURNAL_STREAM`` is ``<device>:<inode>`` of that stream (systemd.exec(5));
    it only counts when ``fd`` is still that very file.
    """
    env = os.environ if environ is None else environ
    device, sep, inode = env.get("JOURNAL_STREAM", "").partition(":")
    if not sep or not device.isdigit() or not inode.isdigit():
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))
