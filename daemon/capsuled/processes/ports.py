"""Ports: the sockets listed processes listen on (``ports: true``, docs/design.md §13 "Ports").

:func:`read_ports` reads them for one request, in a worker thread, as ``ss
-lnp`` finds them: a process's sockets are the ``socket:[INODE]`` links of
``/proc/<pid>/fd``, and what each socket is bound to is the kernel's record
with that inode in its network namespace. For the daemon's own namespace the
records come from the kernel's sock_diag netlink interface, asked for the
listening sockets only (:mod:`.sock_diag`, what ``ss`` asks); for a protocol
it does not serve, and for a process in another namespace, from the
``/proc/<pid>/net/{tcp,tcp6,udp,udp6}`` tables. Each namespace is read once
per request, whatever the number of processes in it.

* TCP: a socket in the ``LISTEN`` state. UDP: a socket bound to a port and
  not connected (``ss -uln``'s ``UNCONN``): the state the kernel calls
  ``TCP_CLOSE`` with no remote address. A connected UDP socket (a DNS
  client's, say) is not listening.
* A socket several processes hold (inherited across ``fork``, passed over a
  Unix socket: a pre-forking server) is listed under each of them, as
  ``lsof`` lists it.
* ``None``, "the OS does not say", where the descriptors cannot be read: a
  process of another user (``/proc/<pid>/fd`` needs the right to ``ptrace``
  it), a zombie, one gone or whose pid names a process started at another
  time than the listed one. Off Linux, psutil's ``net_connections`` answers
  for the process, and ``None`` where it refuses.

Blocking (``/proc`` reads); :func:`with_ports` runs it in a worker thread.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

import anyio.to_thread
import msgspec
import psutil

from capsule_client.kit.proc import NOT_LIVE_STATES, parse_stat, read_stat_line
from capsule_client.wire import ActiveSessionsSnapshot, ListeningSocket, SessionProcess

from . import sock_diag
from .argv import START_TOLERANCE_S
from .table import Clock

__all__ = ["Ports", "listening_in", "read_ports", "socket_inodes", "with_ports"]

#: A process's listening sockets, or None where the OS does not say.
Ports: TypeAlias = list[ListeningSocket] | None
#: A listed process: (pid, started_at as listed, Unix seconds).
Key: TypeAlias = tuple[int, int]

_LINUX: Final = sys.platform.startswith("linux") and os.path.isdir("/proc/self")
#: The tables of a network namespace: file name, protocol, address bytes.
_TABLES: Final[tuple[tuple[str, Literal["tcp", "udp"], int], ...]] = (
    ("tcp", "tcp", 4),
    ("tcp6", "tcp", 16),
    ("udp", "udp", 4),
    ("udp6", "udp", 16),
)
#: What sock_diag is asked for each table: family, protocol, states.
_DIAG: Final = {
    "tcp": (socket.AF_INET, socket.IPPROTO_TCP, sock_diag.TCP_LISTEN_STATES),
    "tcp6": (socket.AF_INET6, socket.IPPROTO_TCP, sock_diag.TCP_LISTEN_STATES),
    "udp": (socket.AF_INET, socket.IPPROTO_UDP, sock_diag.UDP_UNCONNECTED_STATES),
    "udp6": (socket.AF_INET6, socket.IPPROTO_UDP, sock_diag.UDP_UNCONNECTED_STATES),
}
#: ``st`` of a listening TCP socket, and of an unconnected UDP one (``TCP_CLOSE``).
_TCP_LISTEN: Final = b"0A"
_UDP_UNCONNECTED: Final = b"07"
_SOCKET_LINK: Final = "socket:["


def _written(raw: bytes) -> str:
    """An address (4 or 16 bytes, network order) as ``ipaddress`` writes it, an
    IPv4-mapped IPv6 address as ``::ffff:10.0.0.1`` whatever the Python version."""
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return f"::ffff:{address.ipv4_mapped}"
    return str(address)


def _address(text: bytes, size: int) -> str:
    """A ``/proc/net`` address, written as the kernel's ``%08X`` of each 32-bit word
    in the machine's byte order."""
    return _written(
        b"".join(
            int(text[at : at + 8], 16).to_bytes(4, sys.byteorder) for at in range(0, size * 2, 8)
        )
    )


def listening_in(
    data: bytes, proto: Literal["tcp", "udp"], size: int
) -> dict[int, ListeningSocket]:
    """inode → listening socket of one ``/proc/net/{tcp,tcp6,udp,udp6}`` table.

    Args:
        data: the table as read, its heading line first.
        proto: ``tcp`` or ``udp``.
        size: the address size, bytes (4 for IPv4, 16 for IPv6).

    A line that does not parse is skipped (the kernel writes none).
    """
    wanted = _TCP_LISTEN if proto == "tcp" else _UDP_UNCONNECTED
    found: dict[int, ListeningSocket] = {}
    for line in data.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != wanted:
            continue
        try:
            local_address, local_port = fields[1].split(b":")
            remote_address, remote_port = fields[2].split(b":")
            if proto == "udp" and (int(remote_port, 16) or int(remote_address, 16)):
                continue  # connected: it sends to one peer, it does not listen
            port = int(local_port, 16)
            if port == 0:
                continue  # not bound to a port yet
            found[int(fields[9])] = ListeningSocket(proto, _address(local_address, size), port)
        except ValueError:
            continue
    return found


def _read_all(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _diagnosed(name: str, proto: Literal["tcp", "udp"]) -> dict[int, ListeningSocket] | None:
    """inode → listening socket of one table of the daemon's namespace, from sock_diag;
    None where the kernel does not serve it so."""
    try:
        bound = sock_diag.dump(*_DIAG[name])
    except OSError:
        return None
    return {
        b.inode: ListeningSocket(proto, _written(b.address), b.port)
        for b in bound
        if b.port and not b.connected
    }


def _namespace_tables(base: str, *, own: bool = False) -> dict[int, ListeningSocket]:
    """inode → listening socket of the four tables under ``base`` (``/proc/net`` or
    ``/proc/<pid>/net``); a table the kernel lacks (no IPv6) counts as empty. ``own``:
    the daemon's namespace, asked of sock_diag first.

    Raises:
        OSError: ``base`` is gone (a process that exited) or refused.
    """
    found: dict[int, ListeningSocket] = {}
    read = False
    for name, proto, size in _TABLES:
        diagnosed = _diagnosed(name, proto) if own else None
        if diagnosed is not None:
            found.update(diagnosed)
            read = True
            continue
        try:
            data = _read_all(f"{base}/{name}")
        except FileNotFoundError:
            continue
        read = True
        found.update(listening_in(data, proto, size))
    if not read:
        raise FileNotFoundError(f"{base} has no socket tables")
    return found


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets ``/proc/<pid>/fd`` links to. Blocking.

    Raises:
        PermissionError: the OS does not show them (another user's process).
        OSError: the process is gone (``ENOENT``, ``ESRCH``).
    """
    inodes: set[int] = set()
    directory = os.open(f"/proc/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in os.listdir(directory):
            try:
                link = os.readlink(name, dir_fd=directory)
            except FileNotFoundError:
                continue  # closed while the directory was read
            if link.startswith(_SOCKET_LINK):
                inodes.add(int(link[len(_SOCKET_LINK) : -1]))
    finally:
        os.close(directory)
    return inodes


def _start_ticks(pid: int) -> int | None:
    """The start of ``pid`` from its stat line, or None when gone or not live."""
    try:
        stat = parse_stat(read_stat_line(pid))
    except (OSError, ValueError):
        return None
    return None if stat.state in NOT_LIVE_STATES else stat.start_ticks


@dataclass(slots=True)
class _Reading:
    """One request's reading: the namespaces' tables, read once each."""

    clock: Clock
    own_namespace: str | None
    tables: dict[str | None, dict[int, ListeningSocket] | None] = field(default_factory=dict)

    def sockets(self, pid: int) -> dict[int, ListeningSocket] | None:
        """The listening sockets of ``pid``'s network namespace (None: unreadable)."""
        try:
            namespace: str | None = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            namespace = None  # no namespaces in this kernel: the daemon's tables
        if namespace == self.own_namespace:
            namespace = None
        if namespace not in self.tables:
            try:
                self.tables[namespace] = (
                    _namespace_tables("/proc/net", own=True)
                    if namespace is None
                    else _namespace_tables(f"/proc/{pid}/net")
                )
            except OSError:
                return None  # gone meanwhile: the next process of the namespace reads it
        return self.tables[namespace]


def _ports_linux(pid: int, started_at: int, reading: _Reading) -> Ports:
    """``pid``'s listening sockets if it is the process listed as started at ``started_at``."""
    before = _start_ticks(pid)
    if before is None or abs(reading.clock.seconds(before) - started_at) > START_TOLERANCE_S:
        return None
    try:
        inodes = socket_inodes(pid)
    except OSError:  # another user's (EACCES), or gone
        return None
    if not inodes:
        found: Ports = []
    else:
        sockets = reading.sockets(pid)
        if sockets is None:
            return None
        found = sorted(
            {sockets[inode] for inode in inodes if inode in sockets},
            key=lambda s: (s.proto, s.port, s.address),
        )
    if _start_ticks(pid) != before:  # exited, or the pid was reused, while it was read
        return None
    return found


def _ports_psutil(pid: int, started_at: int) -> Ports:
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - started_at) > START_TOLERANCE_S:
            return None
        connections = process.net_connections(kind="inet")
    except psutil.Error:
        return None
    found: set[ListeningSocket] = set()
    for connection in connections:
        if not connection.laddr:
            continue
        if connection.type == socket.SOCK_STREAM:
            if connection.status != psutil.CONN_LISTEN:
                continue
            proto: Literal["tcp", "udp"] = "tcp"
        elif connection.raddr:
            continue
        else:
            proto = "udp"
        address = str(ipaddress.ip_address(connection.laddr.ip.split("%")[0]))
        found.add(ListeningSocket(proto, address, connection.laddr.port))
    return sorted(found, key=lambda s: (s.proto, s.port, s.address))


def read_ports(keys: Iterable[Key]) -> dict[Key, Ports]:
    """``(pid, started_at)`` → listening sockets (or None) for each of ``keys``, read now.

    One reading of each network namespace's tables for all of them.
    Blocking; run it in a worker thread.
    """
    if not _LINUX:
        return {key: _ports_psutil(*key) for key in keys}
    try:
        own_namespace: str | None = os.readlink("/proc/self/ns/net")
    except OSError:
        own_namespace = None
    reading = _Reading(Clock(), own_namespace)
    return {key: _ports_linux(key[0], key[1], reading) for key in keys}


async def with_ports(answer: ActiveSessionsSnapshot) -> ActiveSessionsSnapshot:
    """A copy of ``answer`` whose every process carries ``ports`` (a list, or None).

    Read in a worker thread, once per call: never on the event loop, and never
    kept (a socket is opened and closed without any event the daemon hears).
    """
    processes = [*(p for s in answer.sessions for p in s.processes), *answer.unowned]
    if not processes:
        return answer
    keys = [(p.pid, p.started_at) for p in processes]
    ports = await anyio.to_thread.run_sync(read_ports, keys, abandon_on_cancel=True)

    def listed(process: SessionProcess) -> SessionProcess:
        return msgspec.structs.replace(process, ports=ports.get((process.pid, process.started_at)))

    return msgspec.structs.replace(
        answer,
        sessions=[
            msgspec.structs.replace(s, processes=[listed(p) for p in s.processes])
            for s in answer.sessions
        ],
        unowned=[listed(p) for p in answer.unowned],
    )
