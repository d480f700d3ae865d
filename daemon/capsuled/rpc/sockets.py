"""The listening socket: bound (a stale one replaced), kept, mended, removed (docs/design.md §8).

At start :func:`open_listener` takes the socket systemd passed
(:mod:`capsuled.rpc.activation`) or makes one: the socket's directory 0700
(:func:`prepare_socket_directory`), the lock (:mod:`capsuled.rpc.lockfile`)
before the socket is touched, then :func:`bind_unix_socket`, which replaces
only a stale socket. While running, :func:`listening_intact` and
:func:`mend_listening` keep the socket and lock files the daemon's own; on the
way out :meth:`Listening.close` removes only a socket the daemon created,
then releases the lock.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import anyio
import structlog

from capsule_client.kit.paths import MAX_SOCKET_PATH_BYTES, make_private_dirs, remove_made_dirs
from capsuled.startup_errors import AlreadyRunning, ServiceError, SocketPathTaken

from .activation import activated_listener, socket_path_of
from .lockfile import SocketLock, acquire_socket_lock

__all__ = [
    "SOCKET_CHECK_INTERVAL_S",
    "BoundSocket",
    "Listening",
    "SocketMend",
    "bind_unix_socket",
    "keep_listening",
    "listening_intact",
    "mend_listening",
    "open_listener",
    "prepare_socket_directory",
    "remove_socket",
]

_log = structlog.get_logger("capsuled.sockets")

#: How often a daemon that bound its own socket checks that the socket and
#: lock files are still its own (:func:`keep_listening`), seconds.
SOCKET_CHECK_INTERVAL_S = 2.0
#: What the socket check may find again and again: warned about once while it lasts.
_LASTING: Final = {
    "contested": "the lock file was removed and another process holds the new one; "
    "serving on, and locking it again once it is free",
    "foreign": "something else is at the socket's path; this daemon cannot be reached "
    "through it and leaves it alone",
    "failed": "could not mend the socket; serving the one held",
}


def prepare_socket_directory(socket_path: Path) -> list[Path]:
    """Create the socket's directory 0700 if it is missing (docs/design.md §8).

    An existing directory (``$XDG_RUNTIME_DIR``, the home) is left as it is.

    Returns:
        The directories it made, outermost first.

    Raises:
        ServiceError: the directory cannot be created.
    """
    try:
        return make_private_dirs(socket_path.parent)
    except OSError as exc:
        raise ServiceError(
            f"cannot create the socket's directory {socket_path.parent}: {exc.strerror or exc}"
        ) from exc


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
        made_dirs: the socket's directories this start made, outermost first.
    """

    sock: socket.socket
    path: Path
    activated: bool
    lock: SocketLock
    bound: BoundSocket | None = None
    made_dirs: list[Path] = field(default_factory=list)

    def close(self, *, refused: bool = False) -> None:
        """Remove the socket the daemon created, then release the lock. Idempotent.

        In that order: once the lock is free another daemon may bind the path,
        and its socket must not be the one removed. The listening socket itself
        is closed by whoever wrapped it (anyio's listener ``aclose``).

        Args:
            refused: the start was refused: the lock file and the directories
                this start made are removed too, so the socket's directory is as
                it was before (a daemon that served leaves its empty lock file).
        """
        if self.bound is not None and remove_socket(self.bound):
            _log.debug("socket removed", socket=str(self.path))
        self.bound = None
        self.lock.release(remove=refused and self.lock.created)
        if refused:
            remove_made_dirs(self.made_dirs)
            self.made_dirs = []


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
        ServiceError: any of the refusals of this module; nothing was left held, and
            the lock file and directories this call made are removed again.
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
    made = prepare_socket_directory(socket_path)
    try:
        lock = acquire_socket_lock(socket_path)
    except BaseException:
        remove_made_dirs(made)
        raise
    try:
        bound = bind_unix_socket(socket_path)
    except BaseException:
        lock.release(remove=lock.created)  # a refused start leaves nothing behind
        remove_made_dirs(made)
        raise
    return Listening(
        sock=bound.sock,
        path=socket_path,
        activated=False,
        lock=lock,
        bound=bound,
        made_dirs=made,
    )


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


async def keep_listening(
    listening: Listening,
    *,
    rebound: Callable[[socket.socket], None],
    taken: Callable[[], None],
) -> None:
    """Every ``SOCKET_CHECK_INTERVAL_S``, mend the socket and lock files (docs/service.md).

    A removed socket is bound again (and handed to ``rebound``); a removed
    lock is taken again. If a second daemon took the lock first and the
    socket is no longer this daemon's, ``taken`` is called (the daemon
    stops with exit status 1 and leaves the path to it) and this returns.
    What lasts (something else at the socket's path, a lock another
    process holds, a failure to mend) is warned about once while it lasts.
    Runs until cancelled.
    """
    lasting: set[str] = set()  # what the last check found, warned about already
    while True:
        await anyio.sleep(SOCKET_CHECK_INTERVAL_S)
        if listening_intact(listening):
            lasting = set()
            continue
        details: dict[str, str] = {}
        try:
            done: list[str] = list(await anyio.to_thread.run_sync(mend_listening, listening))
        except ServiceError as exc:
            done, details = ["failed"], {"error": str(exc)}
        if "taken" in done:
            _log.error(
                "the lock file was removed and another daemon has locked it; stopping",
                lock=str(listening.lock.path),
            )
            taken()
            return
        if "relocked" in done:
            _log.warning(
                "the lock file was removed; locked it again", lock=str(listening.lock.path)
            )
        if "rebound" in done:
            rebound(listening.sock)
            _log.warning("the socket file was removed; bound it again", socket=str(listening.path))
        found = _LASTING.keys() & done
        for key in sorted(found - lasting):
            _log.warning(
                _LASTING[key],
                socket=str(listening.path),
                lock=str(listening.lock.path),
                **details,
            )
        lasting = found
