"""Load on the real daemon: many clients, idle and stuck connections, the cap.

The rules are docs/design.md §7, §8.

Sizes: CI runs a few thousand requests; ``CAPSULED_HARDENING_FULL=1`` runs
200 concurrent clients x 500 mixed requests and 500 idle connections. The
clients run in this test process on one event loop (anyio + AsyncClient), so
the latencies include the clients' own scheduling; docs/reliability.md says so.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers.daemon import DaemonProcess, raw_exchange
from helpers.reliability import (
    FULL,
    FULL_TIMEOUT_S,
    Prefixed,
    nofile_of,
    percentile,
    raise_nofile_limit,
    record,
    size,
)
from helpers.waits import wait_until

from capsule_client import AsyncClient, Client, Overloaded, RequestTimeout

PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
STATUS = b'{"jsonrpc":"2.0","id":2,"method":"status"}\n'

pytestmark = pytest.mark.timeout(FULL_TIMEOUT_S if FULL else 60)

Request = Callable[[AsyncClient, int, int], Awaitable[Any]]


@pytest.fixture(autouse=True, scope="module")
def _nofile() -> None:
    raise_nofile_limit()


@pytest.fixture
def start(short_dir: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Start a real daemon with extra flags; each test may start one."""
    started: list[DaemonProcess] = []

    def go(*args: str, prefix: Sequence[str] = ()) -> DaemonProcess:
        home = short_dir / f"home{len(started)}"
        home.mkdir(mode=0o700)
        daemon = Prefixed(home, short_dir / f"{len(started)}.sock", args, prefix=prefix)
        started.append(daemon)
        return daemon.start()

    yield go
    for daemon in started:
        daemon.__exit__()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# --------------------------------------------------------------------------
# A load generator on the real client


@dataclass
class Run:
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    by_request: dict[str, list[float]] = field(default_factory=dict)

    def per_request(self) -> dict[str, dict[str, float]]:
        return {
            name.lstrip("_"): {
                "count": len(samples),
                "p50_ms": round(percentile(samples, 0.50) * 1000, 2),
                "p99_ms": round(percentile(samples, 0.99) * 1000, 2),
            }
            for name, samples in sorted(self.by_request.items())
        }

    def figures(self) -> dict[str, Any]:
        count = len(self.latencies_s)
        return {
            "requests": count,
            "errors": len(self.errors),
            "p50_ms": round(percentile(self.latencies_s, 0.50) * 1000, 2),
            "p99_ms": round(percentile(self.latencies_s, 0.99) * 1000, 2),
            "max_ms": round(max(self.latencies_s, default=0) * 1000, 2),
            "requests_per_s": round(count / self.elapsed_s) if self.elapsed_s else 0,
        }


async def _ping(client: AsyncClient, number: int, i: int) -> Any:
    assert (await client.ping()).pong is True


async def _status(client: AsyncClient, number: int, i: int) -> Any:
    assert (await client.status()).pid > 0


async def _reconcile(client: AsyncClient, number: int, i: int) -> Any:
    report = await client.reconcile(f"ses_l{number}_{i}", f"ses_n{number}_{i}", "ctx")
    assert report is not None and [w.work_id for w in report.lost] == [f"wrk_{number}_{i}"]


async def _snapshot(client: AsyncClient, number: int, i: int) -> Any:
    # Every other one forces a fresh observation (single flight shares it).
    snap = await client.snapshot(timeout_ms=5000, max_age_ms=0 if i % 2 else None)
    assert snap.discovery == "ready", snap.gaps


MIX: dict[str, Request] = {
    "ping": _ping,
    "status": _status,
    "sessions.snapshot": _snapshot,
    "session.reconcile": _reconcile,
}


def prior_sessions(home: Path, clients: int, requests: int, mix: Sequence[Request]) -> list[Path]:
    """One prior session with one lost work for each reconcile the load will send."""
    traces = []
    for number in range(clients):
        for i in range(requests):
            if mix[(number + i) % len(mix)] is not _reconcile:
                continue
            directory = home / "sessions" / f"ses_l{number}_{i}"
            directory.mkdir(mode=0o700, parents=True)
            trace = directory / "trace.jsonl"
            trace.write_text(
                json.dumps({"event_type": "task_start", "task_id": "tsk_a", "trust": "trusted"})
                + "\n"
                + json.dumps(
                    {
                        "event_type": "shell_detached",
                        "work_id": f"wrk_{number}_{i}",
                        "task_id": "tsk_a",
                        "binary": "/bin/sh",
                        "command": "sleep 100",
                        "timestamp": 1_700_000_000_000,
                    }
                )
                + "\n"
            )
            traces.append(trace)
    return traces


async def load(socket_path: Path, clients: int, requests: int, mix: Sequence[Request]) -> Run:
    """``clients`` connections at once, each sending ``requests`` one after the other."""
    run = Run()

    async def client(number: int) -> None:
        async with AsyncClient(socket_path, timeout_s=60) as c:
            for i in range(requests):
                request = mix[(number + i) % len(mix)]
                began = time.perf_counter()
                try:
                    await request(c, number, i)
                except Exception as exc:
                    run.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                took_s = time.perf_counter() - began
                run.latencies_s.append(took_s)
                run.by_request.setdefault(request.__name__, []).append(took_s)

    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for number in range(clients):
            tg.start_soon(client, number)
    run.elapsed_s = time.perf_counter() - began
    return run


def test_concurrent_clients_with_mixed_requests_see_no_errors(
    start: Callable[..., DaemonProcess],
) -> None:
    clients, requests = size(20, 200), size(50, 500)
    daemon = start("--log-level", "info")
    mix = list(MIX.values())
    traces = prior_sessions(daemon.home, clients, requests, mix)
    rss_before = rss_kib(daemon.pid)
    run = anyio.run(load, daemon.socket_path, clients, requests, mix)
    rss_after = rss_kib(daemon.pid)
    assert run.errors == [], run.errors[:5]
    assert len(run.latencies_s) == clients * requests
    for trace in traces:  # one marker per lost work, no more
        lines = trace.read_bytes().splitlines()
        assert [json.loads(x)["event_type"] for x in lines][-1:] == ["shell_lost"]
        assert len(lines) == 3
    with Client(daemon.socket_path) as c:
        status = c.status()
    assert status.totals.errors == 0
    assert status.totals.requests >= clients * requests
    record(
        "load",
        {
            "clients": clients,
            "requests_per_client": requests,
            "mix": sorted(MIX),
            "reconciles": len(traces),
            **run.figures(),
            "by_method": run.per_request(),
            "daemon_rss_mib_before_after": [
                round(rss_before / 1024, 1),
                round(rss_after / 1024, 1),
            ],
            "daemon_nofile": nofile_of(daemon.pid),
        },
    )


# --------------------------------------------------------------------------
# Connections that do not play along


def stuff(sock: socket.socket, line: bytes, *, limit_s: float = 10.0) -> int:
    """Send ``line`` over and over without reading until the socket stops taking it."""
    sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + limit_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        try:
            sent += sock.send(line * 64)
            quiet_since = time.monotonic()
        except BlockingIOError:
            if time.monotonic() - quiet_since > 0.2:  # the daemon stopped reading
                return sent
            time.sleep(0.005)
    raise AssertionError("the daemon kept reading from a client that never reads")


def test_a_client_that_never_reads_and_idle_connections_do_not_slow_the_others(
    start: Callable[..., DaemonProcess],
) -> None:
    clients, requests, idle = size(10, 50), size(50, 200), size(100, 500)
    # The stuck client must stay stuck for the whole measurement.
    daemon = start("--log-level", "info", "--write-timeout", "120")
    mix = [_ping]
    anyio.run(load, daemon.socket_path, clients, 10, mix)  # warm up
    # The machine may be shared: a neighbour's burst can land in either half of a
    # round. Up to three rounds (alone, then disturbed); a real slowdown fails all.
    rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for _ in range(3):
        baseline = anyio.run(load, daemon.socket_path, clients, requests, mix)
        disturbed, stuffed = _disturbed(daemon, clients, requests, idle, mix)
        assert baseline.errors == [] and disturbed.errors == []
        before, after = baseline.figures(), disturbed.figures()
        rounds.append((before, after))
        # Generous: an event loop with 500 more idle tasks may be a little slower,
        # but a stuck or idle connection must not make the others wait.
        if (
            after["p99_ms"] <= 5 * before["p99_ms"] + 25
            and after["p50_ms"] <= 5 * before["p50_ms"] + 10
        ):
            break
    else:
        raise AssertionError(f"the others were slowed down in every round: {rounds}")
    assert raw_exchange(daemon.socket_path, PING).count(b'"pong":true') == 1
    record(
        "disturbance",
        {
            "clients": clients,
            "requests_per_client": requests,
            "idle_connections": idle,
            "stuck_client_bytes_sent": stuffed,
            "without": before,
            "with": after,
            "rounds": len(rounds),
        },
    )


def _disturbed(
    daemon: DaemonProcess, clients: int, requests: int, idle: int, mix: Sequence[Request]
) -> tuple[Run, int]:
    """The same load beside a client that never reads and ``idle`` idle connections."""
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.connect(str(daemon.socket_path))
    idlers = []
    try:
        stuffed = stuff(stuck, STATUS)
        for _ in range(idle):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(daemon.socket_path))
            idlers.append(s)
        with Client(daemon.socket_path) as c:
            wait_until(lambda: c.status().clients >= idle + 2, message="idle connections")
        return anyio.run(load, daemon.socket_path, clients, requests, mix), stuffed
    finally:
        for s in idlers:
            s.close()
        stuck.close()
        with Client(daemon.socket_path) as c:
            wait_until(lambda: c.status().clients == 1, message="the disturbers to leave")


def test_a_stuck_reader_is_dropped_after_the_write_timeout(
    start: Callable[..., DaemonProcess],
) -> None:
    write_timeout_s = 1.0
    daemon = start("--write-timeout", str(write_timeout_s))
    with Client(daemon.socket_path) as observer:
        assert observer.status().clients == 1
        stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stuck.connect(str(daemon.socket_path))
        began = time.monotonic()
        with stuck:
            stuff(stuck, STATUS)
            filled = time.monotonic()
            # The others are served meanwhile.
            ping_began = time.monotonic()
            assert observer.ping().pong is True
            ping_s = time.monotonic() - ping_began
            wait_until(
                lambda: observer.status().clients == 1,
                timeout_s=write_timeout_s + 5,
                message="the stuck connection to be dropped",
            )
            dropped = time.monotonic()
            # What the daemon had written before it gave up is there; then the end.
            stuck.setblocking(True)
            stuck.settimeout(5)
            received = b""
            try:
                while chunk := stuck.recv(1 << 20):
                    received += chunk
            except ConnectionResetError:
                pass
    assert dropped - began >= write_timeout_s * 0.9
    assert dropped - filled <= write_timeout_s + 3
    assert ping_s < 0.5
    assert received.count(b"\n") >= 1
    assert "dropping a connection that does not read its replies" in daemon.logs()
    record(
        "stuck_writer",
        {
            "write_timeout_s": write_timeout_s,
            "dropped_after_s": round(dropped - began, 2),
            "others_ping_ms": round(ping_s * 1000, 2),
        },
    )


def _open(socket_path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(socket_path))
    return s


def _ask(s: socket.socket, line: bytes = PING) -> Any:
    """One request and its reply; a refusal may arrive (and the socket close) first."""
    try:
        s.sendall(line)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before the request was sent: the refusal is in the buffer
    buffer = b""
    while not buffer.endswith(b"\n"):
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return None
        buffer += chunk
    return json.loads(buffer)


def test_the_connection_cap_answers_overloaded(start: Callable[..., DaemonProcess]) -> None:
    cap = 8
    daemon = start("--max-connections", str(cap))
    held = [_open(daemon.socket_path) for _ in range(cap)]
    try:
        assert all(_ask(s)["result"]["pong"] is True for s in held)
        with _open(daemon.socket_path) as extra:
            reply = json.loads(extra.recv(65536))
            assert extra.recv(65536) == b""  # closed after the one line
        assert reply["error"]["code"] == -32002 and reply["id"] is None
        assert str(cap) in reply["error"]["message"]
        # Both clients report the refusal, also when it closed the connection
        # before their request went out (a broken pipe while sending).
        for _ in range(size(20, 200)):
            with pytest.raises(Overloaded), Client(daemon.socket_path) as c:
                c.ping()
        anyio.run(_async_refused, daemon.socket_path, size(20, 200))
        held.pop().close()
        wait_until(
            lambda: (r := _ask_fresh(daemon.socket_path)) is not None and "result" in r,
            message="a slot to free up",
        )
    finally:
        for s in held:
            s.close()


async def _async_refused(socket_path: Path, times: int) -> None:
    for _ in range(times):
        with pytest.raises(Overloaded):
            async with AsyncClient(socket_path) as c:
                await c.ping()


def _ask_fresh(socket_path: Path) -> Any:
    with _open(socket_path) as s:
        return _ask(s)


@pytest.mark.slow
def test_out_of_descriptors_still_answers_overloaded(
    start: Callable[..., DaemonProcess],
) -> None:
    """The daemon's open-file limit below --max-connections: the cap must still answer.

    Without care the accept fails with EMFILE and the client waits in the
    backlog with no answer at all.
    """
    nofile = 64
    daemon = start("--log-level", "info", prefix=["prlimit", f"--nofile={nofile}:{nofile}"])
    assert nofile_of(daemon.pid) == (nofile, nofile)
    held: list[socket.socket] = []
    answers: dict[str, int] = {}
    try:
        for _ in range(nofile + 16):
            s = _open(daemon.socket_path)
            held.append(s)
            reply = _ask(s)
            kind = (
                "pong"
                if reply is not None and "result" in reply
                else f"error {reply['error']['code']}"
                if reply is not None
                else "closed"
            )
            answers[kind] = answers.get(kind, 0) + 1
    finally:
        for s in held:
            s.close()
    assert set(answers) == {"pong", "error -32002"}, answers
    # docs/design.md §8: the connections get their share of the limit, no more, no less.
    shared = [
        json.loads(line)
        for line in daemon.logs().splitlines()
        if "the open-file limit is shared out" in line
    ]
    assert answers["pong"] == shared[0]["connections"] >= nofile // 4, answers
    wait_until(
        lambda: (r := _ask_fresh(daemon.socket_path)) is not None and "result" in r,
        message="the daemon to serve again",
    )
    assert os.path.exists(daemon.socket_path)


def test_clients_that_leave_rudely_cost_nothing(start: Callable[..., DaemonProcess]) -> None:
    """Connections closed at every point of an exchange; the daemon serves on, logs no failure."""
    rounds = size(200, 2000)
    daemon = start("--log-level", "info")
    batch = b"[" + b",".join([STATUS.strip()] * 1000) + b"]\n"
    ways = [
        b"",  # connect and close
        b'{"jsonrpc":"2.0","id":1,"meth',  # half a line
        STATUS * 50,  # requests, then close without reading (the daemon's writes fail)
        batch,  # a large reply nobody reads
        b"\xff" * 70_000,  # garbage without a newline
    ]
    for i in range(rounds):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(daemon.socket_path))
        try:
            s.sendall(ways[i % len(ways)])
        except OSError:
            pass
        if i % 2:  # half of the time, half-close first (the last line is then answered)
            s.shutdown(socket.SHUT_WR)
        s.close()
    left = time.monotonic()
    # A burst can leave more than --max-connections behind for a moment (the daemon
    # learns of a close when it next reads or writes): a newcomer is then refused
    # -32002, as documented, until they drain. Its request may also wait behind the
    # batches' statuses for longer than a client's timeout where the daemon gets
    # little of the CPU: not drained yet either. The deadline only catches
    # connections that never end; how soon they do is the figure recorded.
    refused = 0

    def drained() -> bool:
        nonlocal refused
        try:
            with Client(daemon.socket_path) as c:
                return c.status().clients == 1 and c.ping().pong
        except Overloaded:
            refused += 1
            return False
        except RequestTimeout:
            return False

    wait_until(drained, timeout_s=size(30, 120), message="every rude connection to end")
    drained_s = time.monotonic() - left
    logs = daemon.logs()
    assert "connection failed" not in logs and "could not be answered" not in logs, logs[-3000:]
    assert daemon.process is not None and daemon.process.poll() is None
    record(
        "rude_clients",
        {
            "title": "Clients that leave rudely",
            "text": (
                "Connections opened one after another, each leaving at a different point: "
                "at once, after half a line, after 50 requests without reading, after a "
                "batch of 1,000 whose reply nobody reads, after 70 KB of garbage without a "
                "newline; half of them half-close first. The daemon logs no failure."
            ),
            "connections": rounds,
            "drained_after_s": round(drained_s, 2),
            "newcomers_refused_while_draining": refused,
        },
    )
