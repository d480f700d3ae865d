"""Where capsuled's files are (docs/design.md §2).

Both the daemon and the clients resolve the home and the socket with these
functions, so that a client started with the same environment as the daemon
finds it without flags.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "MAX_SOCKET_PATH_BYTES",
    "default_home",
    "default_socket",
    "lock_path_for",
    "make_private_dirs",
    "records_root",
    "remove_made_dirs",
    "store_path",
]

SOCKET_NAME = "capsuled.sock"

#: The longest socket path a Unix socket takes, in bytes: ``sun_path`` holds
#: 108 bytes on Linux and 104 on macOS, the final NUL included.
MAX_SOCKET_PATH_BYTES = 107 if sys.platform.startswith("linux") else 103


def default_home(environ: Mapping[str, str] | None = None) -> Path:
    """The home directory runtimes write receipts into.

    ``$CAPSULE_HOME``, else ``$XDG_STATE_HOME/capsule``, else
    ``~/.local/state/capsule`` (docs/design.md §2). Empty variables count as unset, and
    a relative ``$XDG_STATE_HOME`` is ignored, as the XDG base directory
    specification asks.
    """
    env = os.environ if environ is None else environ
    if home := env.get("CAPSULE_HOME"):
        return Path(home).expanduser()
    if state := _xdg_dir(env, "XDG_STATE_HOME"):
        return state / "capsule"
    return Path.home() / ".local" / "state" / "capsule"


def _xdg_dir(env: Mapping[str, str], name: str) -> Path | None:
    """``$name`` as a path, or ``None`` when it is unset, empty or relative (XDG spec)."""
    value = env.get(name)
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else None


def default_socket(home: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The daemon's Unix socket.

    ``$CAPSULED_SOCKET``, else ``$XDG_RUNTIME_DIR/capsuled.sock``, else
    ``<home>/capsuled.sock`` (docs/design.md §2). An empty or relative
    ``$XDG_RUNTIME_DIR`` is ignored (XDG base directory specification).
    """
    env = os.environ if environ is None else environ
    if sock := env.get("CAPSULED_SOCKET"):
        return Path(sock).expanduser()
    if runtime := _xdg_dir(env, "XDG_RUNTIME_DIR"):
        return runtime / SOCKET_NAME
    return (default_home(env) if home is None else home) / SOCKET_NAME


def lock_path_for(socket_path: Path) -> Path:
    """``<socket>.lock``: the daemon's lock file beside its socket (docs/service.md)."""
    return socket_path.with_name(socket_path.name + ".lock")


def records_root(home: Path) -> Path:
    """``<home>/sessions``: where session directories and their traces live."""
    return home / "sessions"


def store_path(home: Path) -> Path:
    """``<home>/capsule.db``: the ownership store (docs/design.md §4)."""
    return home / "capsule.db"


def make_private_dirs(directory: Path) -> list[Path]:
    """``mkdir -p -m 0700``: every missing level of ``directory`` is made with mode 0700.

    Each level is made on its own and chmod-ed to 0700 after ``mkdir`` (the
    umask may have taken bits; ``Path.mkdir(parents=True)`` would give the
    parents the default mode). Existing directories are left as they are,
    symbolic links to directories included (a home may be one, docs/design.md §3).

    Returns:
        The levels it made, outermost first (:func:`remove_made_dirs` undoes them).

    Raises:
        OSError: a level is not a directory: ``ENOTDIR`` for a file,
            ``ELOOP`` for a symbolic link that leads to no directory (dangling,
            or put in place of a level while it was being made); or ``mkdir``
            failed.
    """
    missing: list[Path] = []
    current = directory
    while not current.is_dir():
        _refuse_non_directory(current)
        missing.append(current)
        if current == current.parent:
            break
        current = current.parent
    made: list[Path] = []
    for level in reversed(missing):
        try:
            level.mkdir(mode=0o700)
        except FileExistsError:
            _refuse_non_directory(level)
            if not level.is_dir():  # pragma: no cover - removed again meanwhile
                raise
            continue
        made.append(level)
        # A symbolic link put in its place meanwhile is refused, not chmod-ed
        # (by path: a descriptor would need the read bit the umask may have taken).
        if stat.S_ISLNK(os.lstat(level).st_mode):
            raise OSError(
                errno.ELOOP, "a symbolic link replaced a directory being made", str(level)
            )
        os.chmod(level, 0o700)
    return made


def remove_made_dirs(made: list[Path]) -> None:
    """Undo :func:`make_private_dirs`: remove the levels it made, innermost first, as
    long as each is empty (one that holds something now stays, with its parents)."""
    for level in reversed(made):
        try:
            level.rmdir()
        except OSError:
            return


def _refuse_non_directory(level: Path) -> None:
    """Raise for something at ``level`` that is not a directory (symbolic links followed)."""
    try:
        st = os.lstat(level)
    except (FileNotFoundError, NotADirectoryError):  # missing; a file above is its parent's
        return
    if stat.S_ISLNK(st.st_mode):
        if level.is_dir():
            return
        raise OSError(errno.ELOOP, "a symbolic link that leads to no directory", str(level))
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "not a directory", str(level))
