"""Why the daemon cannot start: the refusals of start-up (docs/design.md §3, §8).

The supervisor turns a :class:`ServiceError` into its ``StartupError``, which
the entry point logs before exiting 1. Tree::

    ServiceError
    ├── AlreadyRunning      another daemon holds the socket's lock
    ├── SocketPathTaken     something that is not a stale socket is at the socket path
    ├── UnsafeHome          the home is not a directory of ours, closed to others
    └── ActivationError     systemd passed something we cannot serve
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ActivationError",
    "AlreadyRunning",
    "ServiceError",
    "SocketPathTaken",
    "UnsafeHome",
]


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
