"""``max_age_ms: 0`` forces a new observation, even while one is in flight (docs/design.md §5, §7).

Single flight shares a running observation with every request that arrives
meanwhile; a request with ``max_age_ms: 0`` must not get an answer that an
observation begun before it produced. To have an observation in flight at a
known point, the daemon runs without a watcher (every observation walks the
home) over a home with many receipts in ``runtime/exec-processes``, which the
walk lists after ``runs/``: an inotify watch on that directory tells the
test that an observation has finished with ``runs/`` and is busy reading the
bulk. A receipt written into ``runs/`` then cannot be in that observation.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import select
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import Sleepers
from helpers.world import pids

from capsule_client import Client
from capsule_client.kit.receipts import (
    exec_receipt_path,
    write_exec_receipt,
    write_provider_client_receipt,
)
from capsule_client.wire import ActiveSessionsSnapshot

#: Receipts of an exited process in ``runtime/exec-processes``: enough that a
#: walk spends a few hundred milliseconds on them (about 40 µs a receipt).
BULK = 10_000
DEADLINE_S = 10.0

_IN_OPEN = 0x20


@contextmanager
def opened(directory: Path) -> Iterator[Callable[[], None]]:
    """Watch ``directory`` with inotify; yields a function that waits for it to be opened."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0:
        pytest.skip(f"inotify unavailable: {os.strerror(ctypes.get_errno())}")
    try:
        if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch", str(directory))

        def wait() -> None:
            readable, _, _ = select.select([fd], [], [], DEADLINE_S)
            assert readable, f"nobody opened {directory} within {DEADLINE_S} s"
            os.read(fd, 65536)

        yield wait
    finally:
        os.close(fd)


def write_bulk(home: Path, pool: Sleepers) -> None:
    """``BULK`` exec receipts of an exited process (read and dropped by every walk)."""
    gone = pool.start()
    template = json.loads(write_exec_receipt(home, "exe_bulk", gone.pid).read_bytes())
    pool.kill(gone)
    for number in range(BULK):
        exec_id = f"exe_bulk{number:05}"
        exec_receipt_path(home, exec_id).write_text(json.dumps({**template, "exec_id": exec_id}))


def request(number: int) -> bytes:
    params = {"max_age_ms": 0, "timeout_ms": round(DEADLINE_S * 1000)}
    message = {"jsonrpc": "2.0", "id": number, "method": "sessions.snapshot", "params": params}
    return json.dumps(message).encode() + b"\n"


def reply(sock: socket.socket) -> ActiveSessionsSnapshot:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1 << 20)
        assert chunk, "the daemon closed the connection"
        data += chunk
    answer = json.loads(data)
    assert "result" in answer, answer
    return msgspec.convert(answer["result"], ActiveSessionsSnapshot)


def test_max_age_0_waits_for_an_observation_that_began_after_it(
    short_dir: Path, pool: Sleepers
) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    write_bulk(home, pool)
    (home / "runs/run1/inp_a/provider-clients").mkdir(mode=0o700, parents=True)
    process = pool.start()
    args = ["--watch", "off", "--sample-interval", "60"]  # only requests observe
    with DaemonProcess(home, short_dir / "d.sock", args) as daemon:
        with Client(daemon.socket_path) as client:
            # The first walk reads the bulk too: it gets the deadline the requests below get.
            first_walk = client.snapshot(max_age_ms=0, timeout_ms=round(DEADLINE_S * 1000))
            assert first_walk.unowned == []
            observations = client.status().totals.observations
        sockets = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(4)]
        try:
            for sock in sockets:
                sock.settimeout(DEADLINE_S)
                sock.connect(str(daemon.socket_path))
            first, *later = sockets
            with opened(home / "runtime/exec-processes") as walked:
                first.sendall(request(1))  # an observation starts, walks runs/, then the bulk
                walked()
                write_provider_client_receipt(home, "run1", "inp_a", "c1", process.pid)
                for number, sock in enumerate(later, start=2):
                    sock.sendall(request(number))
            before = reply(first)
            answers = [reply(sock) for sock in later]
        finally:
            for sock in sockets:
                sock.close()
        # The observation in flight walked runs/ before the receipt was written.
        assert before.unowned == []
        for answer in answers:
            assert pids(answer) == {"unowned": [("provider_client", process.pid)]}
        # ... and the requests that arrived during it shared the next one.
        assert len({(a.observed_at, msgspec.json.encode(a.cost)) for a in answers}) == 1
        with Client(daemon.socket_path) as client:
            assert client.status().totals.observations == observations + 2
