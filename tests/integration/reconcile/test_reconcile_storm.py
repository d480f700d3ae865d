"""Reconciles of a trace another process holds locked must not starve the daemon's workers."""

from __future__ import annotations

import fcntl
import json
import socket
import time
from pathlib import Path

from helpers.daemon import DaemonProcess
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.kit.trace import TraceWriter

#: More than anyio's default worker threads (40): each used to wait for the lock in one.
STORM = 60


def _detached(root: Path, session_id: str) -> Path:
    trace = TraceWriter(root, session_id)
    trace.shell_detached("wrk_1", "/bin/sh", "sleep 60", task_id="tsk_1")
    return root / session_id / "trace.jsonl"


def _request(sock_path: Path, from_session: str, request_id: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(sock_path))
    params = {"from_session": from_session, "this_session": "ses_new", "context_id": "ctx"}
    message = {"jsonrpc": "2.0", "id": request_id, "method": "session.reconcile", "params": params}
    sock.sendall(json.dumps(message).encode() + b"\n")
    return sock


def test_reconciles_waiting_for_a_locked_trace_leave_discovery_and_other_traces_alone(
    daemon: DaemonProcess,
) -> None:
    root = daemon.home / "sessions"
    locked = _detached(root, "ses_locked")
    _detached(root, "ses_free")
    with locked.open("rb") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # a runtime that holds its trace's lock for a while
        waiting = [_request(daemon.socket_path, "ses_locked", n) for n in range(STORM)]
        try:
            with Client(daemon.socket_path, timeout_s=20) as client:
                # Every reconcile's connection, and this one: with fewer, the
                # waiting reconciles might not fill the workers, and the test
                # would pass whether or not they starve the daemon.
                wait_until(
                    lambda: client.status().clients == STORM + 1,
                    message="the reconciles to arrive",
                )
                started = time.monotonic()
                snapshot = client.snapshot(max_age_ms=0, timeout_ms=3000)
                report = client.reconcile("ses_free", "ses_new", "ctx")
                elapsed_s = time.monotonic() - started
            assert snapshot.discovery == "ready"
            assert report is not None and [w.work_id for w in report.lost] == ["wrk_1"]
            assert elapsed_s < 3.0, f"a fresh snapshot and a free trace took {elapsed_s:.1f} s"
        finally:
            fcntl.flock(holder, fcntl.LOCK_UN)
    try:
        for sock in waiting:
            sock.settimeout(20)
            reply = json.loads(sock.makefile("rb").readline())
            assert "result" in reply, reply
    finally:
        for sock in waiting:
            sock.close()
    markers = [line for line in locked.read_text().splitlines() if "shell_lost" in line]
    assert len(markers) == 1, "one marker, whatever the number of waiting reconciles"
