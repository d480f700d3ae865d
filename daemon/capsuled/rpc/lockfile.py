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
