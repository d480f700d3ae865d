"""``capsulectl ports [PORT]`` through the real daemon (docs/design.md §13 "Ports")."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.listeners import Listener, UnprivilegedDaemon
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.cli.main import main as capsulectl
from capsule_client.kit.paths import store_path
from capsule_client.kit.store import OwnershipStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def daemon(short_dir: Path) -> Iterator[UnprivilegedDaemon]:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with UnprivilegedDaemon(home, short_dir / "d.sock") as process:
        yield process


@pytest.fixture
def served(daemon: UnprivilegedDaemon) -> Iterator[tuple[Listener, Listener, Listener]]:
    """A web server in ``ses_web``, a DNS-like UDP server in ``ses_dns``, and one outside."""
    web, dns, outside = Listener("tcp4"), Listener("udp4", "tcp4"), Listener("tcp4")
    try:
        with OwnershipStore(store_path(daemon.home)) as store:
            for session_id, listener in (("ses_web", web), ("ses_dns", dns)):
                store.ensure_session(session_id)
                store.register_process(listener.pid, session_id)
        with Client(daemon.socket_path) as client:
            wait_until(
                lambda: len(client.snapshot(fresh=True).sessions) == 2, message="both listed"
            )
        yield web, dns, outside
    finally:
        for listener in (web, dns, outside):
            listener.close()


def ctl(daemon: UnprivilegedDaemon, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = capsulectl(["--socket", str(daemon.socket_path), "ports", *args], out=out)
    return code, out.getvalue()


def test_ports_lists_every_sessions_listening_sockets(
    daemon: UnprivilegedDaemon, served: tuple[Listener, Listener, Listener]
) -> None:
    web, dns, outside = served
    code, text = ctl(daemon)
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split() == ["PROTO", "ADDRESS", "PID", "SESSION", "COMMAND"]
    rows = [line.split()[:4] for line in lines[1:]]
    assert rows == [
        ["tcp", f"127.0.0.1:{dns.opened[1][2]}", str(dns.pid), "ses_dns"],
        ["udp", f"127.0.0.1:{dns.opened[0][2]}", str(dns.pid), "ses_dns"],
        ["tcp", f"127.0.0.1:{web.opened[0][2]}", str(web.pid), "ses_web"],
    ]
    assert str(outside.opened[0][2]) not in text  # held outside any session: not listed
    assert "python" in lines[1]  # the command line


def test_ports_port_names_the_session_that_holds_it_and_fails_for_a_free_one(
    daemon: UnprivilegedDaemon,
    served: tuple[Listener, Listener, Listener],
    capsys: pytest.CaptureFixture[str],
) -> None:
    web, dns, outside = served
    code, text = ctl(daemon, str(web.opened[0][2]))
    assert code == 0
    (row,) = text.splitlines()[1:]
    assert row.split()[:4] == ["tcp", f"127.0.0.1:{web.opened[0][2]}", str(web.pid), "ses_web"]

    port = outside.opened[0][2]  # held, but by no session
    assert ctl(daemon, str(port)) == (1, "")
    assert f"no process of a session listens on port {port}" in capsys.readouterr().err

    code, text = ctl(daemon, str(dns.opened[0][2]), "--json")
    assert code == 0
    answer = json.loads(text)
    (session,) = [s for s in answer["sessions"] if s["session_id"] == "ses_dns"]
    assert session["processes"][0]["ports"][0]["proto"] in ("tcp", "udp")
    assert ctl(daemon, str(port), "--json")[0] == 1


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_a_port_that_is_no_port_is_a_usage_error(daemon: UnprivilegedDaemon, port: str) -> None:
    assert ctl(daemon, port)[0] == 2


def test_no_answer_is_never_shown_as_no_ports(
    daemon: UnprivilegedDaemon,
    served: tuple[Listener, Listener, Listener],
    capsys: pytest.CaptureFixture[str],
) -> None:
    os.chmod(daemon.home, 0o777)  # a home others may write: discovery refuses it
    try:
        assert ctl(daemon) == (1, "")
        err = capsys.readouterr().err
        assert err.startswith("capsulectl: discovery unavailable: ") and "chmod 0700" in err
        code, text = ctl(daemon, "--json")
        assert code == 0 and json.loads(text)["discovery"] == "unavailable"
    finally:
        os.chmod(daemon.home, 0o700)
