"""The listening sockets of the daemon's network namespace, asked of the kernel as ``ss`` asks.

:func:`dump` sends one ``SOCK_DIAG_BY_FAMILY`` request over a ``NETLINK_SOCK_DIAG``
socket (sock_diag(7)) for one family and protocol, with a state filter, and
reads the ``inet_diag_msg`` records the kernel sends back: the kernel then walks
only the sockets in the states asked (the listening hash for ``LISTEN``),
where reading ``/proc/net/tcp`` walks every bucket of its connection hash
table, however few sockets there are (docs/benchmarks.md, scenario 21). No
privilege is needed; a kernel without the diag module for a protocol answers
an error, and the caller reads that protocol's ``/proc/net`` table instead.

Linux only, blocking: run it in a worker thread.
"""

from __future__ import annotations

import socket
import struct
from typing import Final, NamedTuple

__all__ = ["TCP_LISTEN_STATES", "UDP_UNCONNECTED_STATES", "Bound", "dump"]

_NETLINK_SOCK_DIAG: Final = 4
_SOCK_DIAG_BY_FAMILY: Final = 20
_NLM_F_REQUEST: Final = 0x1
_NLM_F_DUMP: Final = 0x300
_NLMSG_ERROR: Final = 2
_NLMSG_DONE: Final = 3
#: ``struct nlmsghdr``: length, type, flags, sequence, port id.
_HEADER: Final = struct.Struct("=IHHII")
#: ``struct inet_diag_req_v2`` up to its ``inet_diag_sockid`` (48 bytes, zero: any).
_REQUEST: Final = struct.Struct("=BBBBI48x")
#: In ``struct inet_diag_msg`` (72 bytes): family, state, timer, retrans; the id's
#: source and destination ports (network order) at 4, its source address at 8; its
#: inode at 68.
_PORTS: Final = struct.Struct("!HH")
_INODE_AT: Final = 68
_MESSAGE_SIZE: Final = 72
#: ``1 << TCP_LISTEN``: listening TCP sockets.
TCP_LISTEN_STATES: Final = 1 << 10
#: ``1 << TCP_CLOSE``: a UDP socket that is not connected (a connected one is ``ESTABLISHED``).
UDP_UNCONNECTED_STATES: Final = 1 << 7
_RECEIVE_BYTES: Final = 1 << 16
_TIMEOUT_S: Final = 5.0


class Bound(NamedTuple):
    """A socket the kernel reported: its inode, local address (4 or 16 bytes, network
    order) and local port, and whether it has a peer (a remote port)."""

    inode: int
    address: bytes
    port: int
    connected: bool


def dump(family: int, protocol: int, states: int) -> list[Bound]:
    """Every socket of ``family`` (``AF_INET``, ``AF_INET6``) and ``protocol``
    (``IPPROTO_TCP``, ``IPPROTO_UDP``) in one of ``states`` (a bit per TCP state), in
    the calling thread's network namespace.

    Raises:
        OSError: netlink or the diag module for it is not there (``EPROTONOSUPPORT``,
            ``ENOENT``...), or the kernel answered an error.
    """
    request = _REQUEST.pack(family, protocol, 0, 0, states)
    header = _HEADER.pack(
        _HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
    )
    size = 16 if family == socket.AF_INET6 else 4
    found: list[Bound] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(_TIMEOUT_S)
        link.sendto(header + request, (0, 0))
        while True:
            data = link.recv(_RECEIVE_BYTES)
            if not data:
                raise OSError("sock_diag: the kernel ended the dump without NLMSG_DONE")
            at = 0
            while at + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, at)
                if length < _HEADER.size:
                    raise OSError(f"sock_diag: a message of {length} bytes")
                body = at + _HEADER.size
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    (error,) = struct.unpack_from("=i", data, body)
                    raise OSError(-error, f"sock_diag: {family}/{protocol}")
                if length >= _HEADER.size + _MESSAGE_SIZE:
                    port, peer = _PORTS.unpack_from(data, body + 4)
                    address = data[body + 8 : body + 8 + size]
                    (inode,) = struct.unpack_from("=I", data, body + _INODE_AT)
                    found.append(Bound(inode, address, port, peer != 0))
                at += (length + 3) & ~3
