"""Ports through the real daemon (docs/design.md §13 "Ports"): real listening sockets in
child processes registered with the writer kit, in two sessions; a port outside any
session; a process of another user; a subscription that sees a socket opened."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.listeners import (
    Listener,
    Listeners,
    UnprivilegedDaemon,
    ipv6_loopback,
    system_python,
)
from helpers.processes import DEADLINE_S
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot, ListeningSocket, SessionProcess

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def daemon(short_dir: Path) -> Iterator[UnprivilegedDaemon]:
    """The daemon as an ordinary user runs it: it cannot look into another user's processes."""
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with UnprivilegedDaemon(home, short_dir / "d.sock") as process:
        yield process


def own(home: Path, session_id: str, pid: int) -> None:
    with OwnershipStore(store_path(home)) as store:
        store.ensure_session(session_id)
        store.register_process(pid, session_id)


def listed(snapshot: ActiveSessionsSnapshot) -> dict[int, tuple[str, SessionProcess]]:
    """pid → (its session, the process) of every session process."""
    return {p.pid: (s.session_id, p) for s in snapshot.sessions for p in s.processes}


def sockets(listener: Listener, *indexes: int) -> list[ListeningSocket]:
    chosen = [listener.opened[i] for i in indexes]
    found = [ListeningSocket(proto, address, port) for proto, address, port in chosen]  # type: ignore[arg-type]
    return sorted(found, key=lambda s: (s.proto, s.port, s.address))


def fresh(client: Client, *pids: int) -> dict[int, tuple[str, SessionProcess]]:
    """A read-your-writes snapshot with ports, once it lists every one of ``pids``."""

    def ready() -> dict[int, tuple[str, SessionProcess]] | None:
        found = listed(client.snapshot(fresh=True, commands=True, ports=True))
        return found if set(pids) <= found.keys() else None

    return wait_until(ready, timeout_s=DEADLINE_S, message=f"{pids} listed")


def test_each_sessions_listening_sockets_and_no_one_elses(
    daemon: UnprivilegedDaemon, listeners: Listeners
) -> None:
    web = listeners.start("tcp4", "tcp4-client", "udp4-connected")
    dns = listeners.start("udp4", "tcp4")
    outside = listeners.start("tcp4")  # no session's: its port is nobody's here
    quiet = listeners.start()
    own(daemon.home, "ses_web", web.pid)
    own(daemon.home, "ses_dns", dns.pid)
    own(daemon.home, "ses_dns", quiet.pid)
    with Client(daemon.socket_path) as client:
        found = fresh(client, web.pid, dns.pid, quiet.pid)
        # Listening only: not the connected UDP socket, not a connection's ends.
        assert found[web.pid] == ("ses_web", found[web.pid][1])
        assert found[web.pid][1].ports == sockets(web, 0)
        assert found[dns.pid][0] == "ses_dns"
        assert found[dns.pid][1].ports == sockets(dns, 0, 1)
        assert found[quiet.pid][1].ports == []
        assert outside.pid not in found
        every = [s for _, p in found.values() for s in p.ports or []]
        assert outside.opened[0][2] not in {s.port for s in every}

        plain = client.call_raw("sessions.snapshot", {"max_age_ms": 0})
        assert b'"ports"' not in plain  # only when asked


def test_an_exec_receipts_ipv6_and_udp_sockets(
    daemon: UnprivilegedDaemon, listeners: Listeners
) -> None:
    if not ipv6_loopback():
        pytest.skip("no IPv6 loopback here: ::1 cannot be bound")
    server = listeners.start("tcp6", "udp6", "tcp4")
    with OwnershipStore(store_path(daemon.home)) as store:
        store.register_session("ses_six")
        store.register_exec("exe_six", "ses_six")
    write_exec_receipt(daemon.home, "exe_six", server.pid, command="serve")
    with Client(daemon.socket_path) as client:
        ports = fresh(client, server.pid)[server.pid][1].ports
    assert ports is not None
    assert {(s.proto, s.address, s.port) for s in ports} == set(server.opened)
    assert {s.address for s in ports} == {"::1", "127.0.0.1"}


def test_another_users_process_has_no_ports_and_is_no_error(
    daemon: UnprivilegedDaemon, listeners: Listeners
) -> None:
    if os.geteuid() != 0 or system_python() is None:
        pytest.skip("needs root, to start a process as nobody")
    theirs = listeners.start("tcp4", nobody=True)
    mine = listeners.start("tcp4")
    own(daemon.home, "ses_mixed", theirs.pid)
    own(daemon.home, "ses_mixed", mine.pid)
    with Client(daemon.socket_path) as client:
        found = fresh(client, theirs.pid, mine.pid)
        assert found[theirs.pid][1].ports is None  # the OS does not say
        assert found[mine.pid][1].ports == sockets(mine, 0)
        raw = client.call_raw("sessions.snapshot", {"max_age_ms": 0, "ports": True})
        assert b'"ports":null' in raw
        assert client.ping().pong  # the daemon lives on


def test_a_subscription_with_ports_sees_a_socket_opened(
    daemon: UnprivilegedDaemon, listeners: Listeners
) -> None:
    """Opening a socket makes no event: the subscription checks once a second."""
    server = listeners.start()
    own(daemon.home, "ses_late", server.pid)
    with Client(daemon.socket_path) as client:
        fresh(client, server.pid)
    with Client(daemon.socket_path) as watcher, watcher.subscribe(ports=True) as changes:
        first = next(iter(changes))
        (session,) = first.added
        assert [p.ports for p in session.processes] == [[]]
        (opened,) = server.open("tcp4")
        change = next(iter(changes))
        (changed,) = change.changed
        assert changed.session_id == "ses_late"
        (process,) = changed.processes
        assert process.ports == [ListeningSocket(*opened)]  # type: ignore[arg-type]
        assert change.generation == first.generation  # ports are not what generations count
