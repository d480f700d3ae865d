"""The real capsuled, driven through both clients and through capsulectl."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from helpers.daemon import DaemonProcess
from helpers.waits import wait_until

from capsule_client import (
    AsyncClient,
    Client,
    ClientClosed,
    DaemonNotRunning,
    MethodNotFound,
)
from capsule_client.cli.main import main as capsulectl


def run_capsulectl(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "capsule_client.cli", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def test_blocking_client(daemon: DaemonProcess) -> None:
    with Client(daemon.socket_path) as client:
        assert client.ping().pong is True
        status = client.status()
        assert status.pid == daemon.pid
        assert status.home == str(daemon.home)
        assert status.socket == str(daemon.socket_path)
        assert status.clients == 1
        assert status.totals.requests >= 2  # readiness ping and ours
        assert status.uptime_s >= 0
    with pytest.raises(ClientClosed):
        client.ping()


def test_async_client(daemon: DaemonProcess) -> None:
    async def go() -> tuple[bool, int, int]:
        async with AsyncClient(daemon.socket_path) as client:
            pong = (await client.ping()).pong
            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(client.ping)
            status = await client.status()
            return pong, status.pid, status.totals.requests

    pong, pid, requests = anyio.run(go)
    assert pong is True and pid == daemon.pid and requests >= 12


def test_a_method_the_daemon_lacks_raises_method_not_found(daemon: DaemonProcess) -> None:
    with Client(daemon.socket_path) as client:
        with pytest.raises(MethodNotFound) as caught:
            client.call_raw("no.such.method")
        assert caught.value.code == -32601
        assert client.ping().pong is True  # the connection lives on


def test_clients_name_the_socket_when_the_daemon_is_down(short_dir: Path) -> None:
    missing = short_dir / "nobody.sock"
    with pytest.raises(DaemonNotRunning) as caught, Client(missing) as client:
        client.ping()
    assert caught.value.socket_path == missing
    assert str(missing) in str(caught.value)

    async def go() -> None:
        async with AsyncClient(missing) as client:
            await client.ping()

    with pytest.raises(DaemonNotRunning, match=r"nobody\.sock"):
        anyio.run(go)


def test_capsulectl_ping_and_status(daemon: DaemonProcess) -> None:
    sock = str(daemon.socket_path)
    ping = run_capsulectl("ping", "--socket", sock)
    assert ping.returncode == 0, ping.stderr
    assert "is running" in ping.stdout and sock in ping.stdout

    status = run_capsulectl("--socket", sock, "status")
    assert status.returncode == 0, status.stderr
    assert f"pid {daemon.pid}" in status.stdout and str(daemon.home) in status.stdout

    as_json = run_capsulectl("status", "--json", env={"CAPSULED_SOCKET": sock})
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["pid"] == daemon.pid and document["socket"] == sock


def test_capsulectl_main_in_process(daemon: DaemonProcess) -> None:
    out = io.StringIO()
    assert capsulectl(["ping", "--json", "--socket", str(daemon.socket_path)], out=out) == 0
    assert json.loads(out.getvalue())["pong"] is True


def test_capsulectl_says_how_to_start_the_daemon(
    short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = short_dir / "none.sock"
    assert capsulectl(["status", "--socket", str(missing)], out=io.StringIO()) == 3
    err = capsys.readouterr().err
    assert str(missing) in err
    assert "capsuled" in err and "systemctl --user start capsuled" in err

    proc = run_capsulectl("ping", "--socket", str(missing))
    assert proc.returncode == 3 and str(missing) in proc.stderr


def test_capsulectl_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert capsulectl([]) == 2
    assert capsulectl(["no-such-command"]) == 2
    assert capsulectl(["ping", "--timeout", "soon"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_sigterm_stops_cleanly_and_removes_the_socket(daemon: DaemonProcess) -> None:
    assert daemon.socket_path.exists()
    assert daemon.stop(signal.SIGTERM) == 0
    assert not daemon.socket_path.exists()
    logs = [json.loads(line) for line in daemon.logs().splitlines() if line.startswith("{")]
    events = [entry["event"] for entry in logs]
    assert "capsuled ready" in events and events[-1] == "capsuled stopped"


def test_a_restarted_daemon_numbers_its_answers_above_the_last_run(
    daemon: DaemonProcess,
) -> None:
    """A generation kept from an earlier run never names an answer of this one
    (docs/protocol.md, "Generations and long polls")."""
    with Client(daemon.socket_path) as client:
        before = client.snapshot().generation
    assert daemon.stop(signal.SIGTERM) == 0
    daemon.start()
    with Client(daemon.socket_path) as client:
        after = client.snapshot().generation
        # A long poll with the old generation answers at once, not at its timeout.
        started = time.monotonic()
        assert client.snapshot(since=before, timeout_ms=30_000).generation == after
        assert time.monotonic() - started < 5.0
    assert after > before


def test_sigint_stops_cleanly(daemon: DaemonProcess) -> None:
    assert daemon.stop(signal.SIGINT) == 0
    assert not daemon.socket_path.exists()


def test_socket_is_private_in_a_private_directory(short_dir: Path) -> None:
    home = short_dir / "home"
    sock = short_dir / "run" / "deep" / "c.sock"
    with DaemonProcess(home, sock):
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(home.stat().st_mode) == 0o700  # created by the daemon


def test_each_request_is_logged_with_method_duration_and_outcome(daemon: DaemonProcess) -> None:
    with Client(daemon.socket_path) as client:
        client.status()
        with pytest.raises(MethodNotFound):
            client.call_raw("nope")

    def logged() -> list[dict[str, object]]:
        lines = [json.loads(x) for x in daemon.logs().splitlines() if x.startswith("{")]
        return [
            x
            for x in lines
            if x.get("event") == "request" and x.get("method") in ("status", "nope")
        ]

    entries = wait_until(lambda: len(logged()) == 2 and logged(), message="request logs")
    assert [(e["method"], e["outcome"]) for e in entries] == [("status", "ok"), ("nope", -32601)]
    assert all(isinstance(e["duration_ms"], float) and e["level"] == "debug" for e in entries)


def test_help_names_every_flag_and_variable() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "capsuled", "--help"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0
    for word in (
        "--home",
        "CAPSULE_HOME",
        "--socket",
        "CAPSULED_SOCKET",
        "--sample-interval",
        "CAPSULED_SAMPLE_INTERVAL",
        "--verify-interval",
        "CAPSULED_VERIFY_INTERVAL",
        "--poll-interval",
        "CAPSULED_POLL_INTERVAL",
        "--log-format",
        "CAPSULED_LOG_FORMAT",
        "--log-level",
        "CAPSULED_LOG_LEVEL",
    ):
        assert word in proc.stdout, word


def test_bad_configuration_exits_2_with_a_reason(short_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "capsuled", "--home", str(short_dir), "--sample-interval", "-1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "sample interval" in proc.stderr


def test_a_file_at_the_socket_path_is_refused_and_kept(short_dir: Path) -> None:
    sock = short_dir / "taken.sock"
    sock.write_text("not a socket")
    daemon = DaemonProcess(short_dir / "home", sock).start(wait=False)
    assert daemon.process is not None
    assert daemon.process.wait(timeout=30) == 1
    assert sock.read_text() == "not a socket"
    assert "refusing to replace" in daemon.logs()


@pytest.mark.parametrize("command", [["status", "--json"], ["sessions"], ["ping"]])
def test_capsulectl_into_a_closed_pipe_exits_quietly(
    daemon: DaemonProcess, command: list[str]
) -> None:
    """`capsulectl sessions --json | head -c 100`: no traceback when the reader leaves."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as closed:
        argv = [sys.executable, "-m", "capsule_client.cli", "--socket", str(daemon.socket_path)]
        proc = subprocess.run(
            [*argv, *command], stdout=closed, stderr=subprocess.PIPE, timeout=30, check=False
        )
    assert proc.returncode == 0
    assert proc.stderr == b""


def test_capsulectl_names_a_running_daemon_whose_socket_was_removed(
    daemon: DaemonProcess,
) -> None:
    """A tmp cleaner removed the socket: `capsuled` would refuse to start, so say who holds it."""
    daemon.socket_path.unlink()
    proc = run_capsulectl("ping", "--socket", str(daemon.socket_path))
    assert proc.returncode == 3
    assert f"pid {daemon.pid}" in proc.stderr and "socket was removed" in proc.stderr
    assert "Traceback" not in proc.stderr
