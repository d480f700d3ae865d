"""Ports: the sockets a listed process listens on, read from /proc (docs/design.md §13).

The table parser against lines as the kernel writes them; the reading against real
processes with real sockets: listening or not, inherited across fork, another
network namespace, a gone or reused pid.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys

import pytest
from helpers.listeners import Listeners, ipv6_loopback

from capsule_client.kit.proc import process_start_time
from capsule_client.wire import ListeningSocket
from capsuled.processes.ports import listening_in, read_ports

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def table(*rows: tuple[str, str, str, int]) -> bytes:
    """A ``/proc/net`` table: a heading, then one line per (local, remote, st, inode)."""
    lines = ["  sl  local_address rem_address   st tx_queue rx_queue tr ... uid  timeout inode"]
    for number, (local, remote, state, inode) in enumerate(rows):
        lines.append(
            f"{number:4}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000"
            f"  1000        0 {inode} 1 0000000000000000 100 0 0 10 0"
        )
    return "\n".join([*lines, "   9: garbage", ""]).encode()


V6_ANY = "0" * 32
V6_LOOPBACK = "0" * 24 + "01000000"
TCP = table(
    ("0100007F:0BB8", "00000000:0000", "0A", 111),  # 127.0.0.1:3000, listening
    ("0100007F:0BB8", "0100007F:C350", "01", 112),  # a connection to it
    ("00000000:0050", "00000000:0000", "0A", 113),  # 0.0.0.0:80
)
UDP6 = table(
    (f"{V6_LOOPBACK}:14E9", f"{V6_ANY}:0000", "07", 221),  # [::1]:5353, not connected
    (f"{V6_LOOPBACK}:D431", f"{V6_LOOPBACK}:0035", "01", 222),  # connected to [::1]:53
    ("0000000000000000FFFF00000100007F:0000", f"{V6_ANY}:0000", "07", 223),  # no port
    ("0000000000000000FFFF00000A00000A:0202", f"{V6_ANY}:0000", "07", 224),  # mapped v4
)


@pytest.mark.skipif(sys.byteorder != "little", reason="the lines are a little-endian kernel's")
def test_the_tables_are_read_as_ss_reads_them() -> None:
    assert listening_in(TCP, "tcp", 4) == {
        111: ListeningSocket("tcp", "127.0.0.1", 3000),
        113: ListeningSocket("tcp", "0.0.0.0", 80),
    }  # not the established connection, not the line that does not parse
    assert listening_in(UDP6, "udp", 16) == {
        221: ListeningSocket("udp", "::1", 5353),
        224: ListeningSocket("udp", "::ffff:10.0.0.10", 514),
    }  # not the connected socket, not the one bound to no port


def key(pid: int) -> tuple[int, int]:
    return pid, round(process_start_time(pid))


def test_a_process_s_listening_sockets_and_only_those(listeners: Listeners) -> None:
    specs = ["tcp4", "udp4", "tcp4-client", "udp4-connected"]
    if ipv6_loopback():
        specs += ["tcp6", "udp6"]
    server = listeners.start(*specs)
    quiet = listeners.start()
    found = read_ports([key(server.pid), key(quiet.pid)])
    expected = {
        ListeningSocket(proto, address, port)  # type: ignore[arg-type]
        for (proto, address, port), spec in zip(server.opened, specs, strict=True)
        if not spec.endswith(("client", "connected"))
    }
    ports = found[key(server.pid)]
    assert ports is not None and set(ports) == expected and len(ports) == len(expected)
    assert ports == sorted(ports, key=lambda s: (s.proto, s.port, s.address))
    assert found[key(quiet.pid)] == []


def test_a_socket_inherited_across_fork_is_each_holders() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        child = subprocess.Popen(
            ["sleep", "300"], pass_fds=[listening.fileno()], stdout=subprocess.DEVNULL
        )
        try:
            port = listening.getsockname()[1]
            found = read_ports([key(child.pid)])
            assert found[key(child.pid)] == [ListeningSocket("tcp", "127.0.0.1", port)]
        finally:
            child.kill()
            child.wait(timeout=10)


def test_a_gone_or_reused_pid_has_no_answer(listeners: Listeners) -> None:
    server = listeners.start("tcp4")
    pid, started_at = key(server.pid)
    assert read_ports([(pid, started_at - 3600)]) == {(pid, started_at - 3600): None}
    server.close()
    assert read_ports([(pid, started_at)]) == {(pid, started_at): None}


def test_a_process_in_another_network_namespace_is_read_in_its_own() -> None:
    """Its tables are its namespace's (``/proc/<pid>/net``), not the daemon's."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("cannot make a network namespace here (needs root)")
    code = (
        "import socket, time; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); "
        "time.sleep(300)"
    )
    inner = subprocess.Popen(
        [
            "unshare",
            "--net",
            "sh",
            "-c",
            'ip link set lo up 2>/dev/null; exec "$0" "$@"',
            sys.executable,
            "-c",
            code,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert inner.stdout is not None
        port = int(inner.stdout.readline())
        found = read_ports([key(inner.pid)])
        assert found[key(inner.pid)] == [ListeningSocket("tcp", "127.0.0.1", port)]
        with socket.socket() as ours:  # the same port is free in the daemon's namespace
            ours.bind(("127.0.0.1", port))
    finally:
        inner.kill()
        inner.wait(timeout=10)
        if inner.stdout is not None:
            inner.stdout.close()
