"""Where capsuled's files are (docs/design.md §2).

Both the daemon and the clients resolve the home and the socket with these
functions, so that a client started with the same environment as the daemon
finds it without flags.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "MAX_SOCKET_PATH_BYTES",
    "default_home",
    "default_socket",
    "lock_path_for",
    "records_root",
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
