"""The peer of a connection: its credentials; another user is refused -32006 (docs/design.md §8)."""

from __future__ import annotations

import os
import socket
import struct
import sys
from dataclasses import dataclass
from typing import Final

import structlog

from capsuled.errors import PermissionDenied

from .jsonrpc import encode_error

__all__ = ["PeerCredentials", "peer_credentials", "permission_denied_line", "refuse_peer"]

_log = structlog.get_logger("capsuled.peers")


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
    return encode_error(error.code, error.message, None, error.data)


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
