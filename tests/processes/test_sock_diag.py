"""sock_diag against /proc/net: the two ways of asking the kernel for the listening
sockets of a namespace agree, socket for socket (docs/design.md §13 "Ports")."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.listeners import ipv6_loopback

from capsule_client.wire import ListeningSocket
from capsuled.processes import ports

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="netlink, /proc")


Opened = tuple[list[tuple[socket.socket, ListeningSocket]], list[socket.socket]]


@pytest.fixture
def opened() -> Iterator[Opened]:
    """Sockets of every kind in this process: the listening ones with what they listen
    on, and the others (a connection's two ends, a connected UDP socket)."""
    listening: list[tuple[socket.socket, ListeningSocket]] = []
    others: list[socket.socket] = []
    hosts = [(socket.AF_INET, "127.0.0.1")]
    if ipv6_loopback():
        hosts.append((socket.AF_INET6, "::1"))
    try:
        for family, host in hosts:
            tcp = socket.socket(family, socket.SOCK_STREAM)
            tcp.bind((host, 0))
            tcp.listen()
            listening.append((tcp, ListeningSocket("tcp", host, tcp.getsockname()[1])))
            client = socket.socket(family, socket.SOCK_STREAM)
            others.append(client)
            client.connect(tcp.getsockname()[:2])
            others.append(tcp.accept()[0])
            udp = socket.socket(family, socket.SOCK_DGRAM)
            udp.bind((host, 0))
            listening.append((udp, ListeningSocket("udp", host, udp.getsockname()[1])))
            connected = socket.socket(family, socket.SOCK_DGRAM)
            others.append(connected)
            connected.bind((host, 0))
            connected.connect((host, 9))
        yield listening, others
    finally:
        for sock, _ in listening:
            sock.close()
        for sock in others:
            sock.close()


def from_proc() -> dict[int, ListeningSocket]:
    found: dict[int, ListeningSocket] = {}
    for name, proto, size in ports._TABLES:
        path = Path("/proc/net") / name
        if path.exists():
            found.update(ports.listening_in(path.read_bytes(), proto, size))
    return found


def from_diag() -> dict[int, ListeningSocket]:
    found: dict[int, ListeningSocket] = {}
    for name, proto, _ in ports._TABLES:
        diagnosed = ports._diagnosed(name, proto)
        if diagnosed is None:
            pytest.skip(f"sock_diag does not serve {name} here")
        found.update(diagnosed)
    return found


def inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino


def test_sock_diag_and_proc_net_see_the_same_listening_sockets(opened: Opened) -> None:
    listening, others = opened
    diag, proc = from_diag(), from_proc()
    for sock, expected in listening:
        assert diag.get(inode(sock)) == proc.get(inode(sock)) == expected
    for sock in others:
        assert inode(sock) not in diag and inode(sock) not in proc
