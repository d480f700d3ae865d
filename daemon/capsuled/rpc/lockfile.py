"""One daemon per socket: the exclusive lock file beside it (docs/design.md §8)."""

from __future__ import annotations

import fcntl
import os
import stat
import time
from pathlib import Path
from typing import Final

from capsule_client.kit.paths import lock_path_for
from capsuled.home.strictness import user_name
from capsuled.startup_errors import AlreadyRunning, ServiceError

__all__ = ["SocketLock", "acquire_socket_lock"]

#: How long a second daemon waits for the first to write its pid into the lock
#: file when it finds the lock taken but the file still empty.
_LOCK_PID_WAIT_S: Final = 0.5
#: How often a lock is taken again on a file a refused start removed meanwhile.
_OPEN_ATTEMPTS: Final = 100


class SocketLock:
    """An exclusive ``flock`` on ``<socket>.lock``, with the owner's pid written in it.

    The lock lives as long as the open file description: it goes away when the
    daemon exits, however it exits (``kill -9`` included), so a stale lock
    cannot exist. A running daemon leaves the file in place when it stops; only
    a start that is refused removes the file it created (:meth:`release` with
    ``remove``), unlinking it while it still holds the lock. That is safe because
    :func:`acquire_socket_lock` keeps a lock only on the file still at the path:
    another daemon that opened the removed file finds, once it holds the lock,
    that the path names another file (or none), and opens the path again.

    Attributes:
        path: the lock file.
        created: whether :func:`acquire_socket_lock` created the file.
    """

    def __init__(self, fd: int, path: Path, *, created: bool = False) -> None:
        self._fd: int | None = fd
        self.path = path
        self.created = created

    @property
    def held(self) -> bool:
        """Whether :meth:`release` has not been called yet."""
        return self._fd is not None

    def is_at_its_path(self) -> bool:
        """Whether the file at :attr:`path` is still the one this lock holds.

        False once it was removed or replaced (a clean-up of the directory):
        another daemon could then lock a new file there.
        """
        return self._fd is not None and self._is_at_path(self._fd)

    def _is_at_path(self, fd: int) -> bool:
        try:
            at_path = os.lstat(self.path)
        except OSError:
            return False
        held = os.fstat(fd)
        return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)

    def release(self, *, remove: bool = False) -> None:
        """Empty the pid and drop the lock. Idempotent.

        Args:
            remove: unlink the file first, while the lock is still held (a refused
                start removes the file it created), if it is still this lock's.
        """
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if remove and self._is_at_path(fd):
                os.unlink(self.path)
            else:
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
    symbolic link and must be a regular file owned by the effective uid. A lock
    taken on a file that is no longer at the path (a refused start removed it
    meanwhile) is let go, and the path opened again.

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
    for _ in range(_OPEN_ATTEMPTS):
        fd, created = _open_lock_file(path)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise ServiceError(
                    f"the lock file {path} is not a regular file owned by "
                    f"{user_name(os.geteuid())}; remove it if no capsuled is running"
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AlreadyRunning(_read_lock_pid(fd), path, socket_path) from None
            lock = SocketLock(fd, path, created=created)
            if not lock.is_at_its_path():  # removed after the open: not the path's lock
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid() if pid is None else pid}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return lock
    raise ServiceError(f"the lock file {path} kept being removed while it was locked")


def _open_lock_file(path: Path) -> tuple[int, bool]:
    """A descriptor of the lock file, made if missing, and whether it was made now."""
    flags = os.O_RDWR | os.O_NOFOLLOW  # non-inheritable by default (PEP 446)
    try:
        for _ in range(_OPEN_ATTEMPTS):
            try:
                return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600), True
            except FileExistsError:
                pass
            try:
                return os.open(path, flags), False
            except FileNotFoundError:
                continue  # removed between the two opens: make it
    except OSError as exc:
        raise ServiceError(f"cannot open the lock file {path}: {exc.strerror or exc}") from exc
    raise ServiceError(f"the lock file {path} kept being removed while it was opened")


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
