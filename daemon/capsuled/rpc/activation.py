"""Socket activation: the listening socket systemd passed (sd_listen_fds(3), docs/design.md §8)."""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping
from pathlib import Path
from typing import Final

from capsuled.startup_errors import ActivationError

__all__ = ["LISTEN_FDS_START", "activated_listener", "socket_path_of"]

#: The first file descriptor systemd passes (``SD_LISTEN_FDS_START``, sd_listen_fds(3)).
LISTEN_FDS_START: Final = 3
_ACTIVATION_VARIABLES: Final = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


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
