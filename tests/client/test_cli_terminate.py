"""``capsulectl terminate``, the clients' ``terminate``, and descendants under their roots."""

from __future__ import annotations

import io
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import capsule_client
from capsule_client import AsyncClient, Client, NoSuchSession
from capsule_client.cli.main import main
from capsule_client.cli.render.tables import render_sessions, render_top
from capsule_client.cli.render.terminate import render_terminate
from capsule_client.cli.render.tree import nested
from capsule_client.wire import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    Session,
    SessionProcess,
    TerminatedProcess,
    TerminateReport,
)

CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")

REPORT = TerminateReport(
    session_id="ses_a",
    processes=[
        TerminatedProcess(
            pid=10,
            started_at=100,
            kind="process",
            outcome="exited",
            command=["sh", "-c", "sleep 9 &"],
        ),
        TerminatedProcess(
            pid=11,
            started_at=101,
            kind="descendant",
            outcome="killed",
            parent_pid=10,
            root_pid=10,
            command=["sleep", "9"],
        ),
        TerminatedProcess(
            pid=12,
            started_at=102,
            kind="descendant",
            outcome="refused",
            error="not permitted",
            parent_pid=77,
            root_pid=10,
            command=["python", "-m", "http.server"],
        ),
    ],
    duration_ms=5012,
)


class CannedDaemon:
    """A Unix socket that answers every request line with one canned reply and keeps the
    requests: what the client sends and how it reads the answer, with no daemon needed."""

    def __init__(self, path: Path, reply: dict[str, Any]) -> None:
        self.path = path
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rwb") as stream:
                for line in stream:
                    request = json.loads(line)
                    self.requests.append(request)
                    answer = {"jsonrpc": "2.0", "id": request["id"], **self.reply}
                    stream.write(json.dumps(answer).encode() + b"\n")
                    stream.flush()

    def close(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def canned(short_dir: Path) -> Iterator[CannedDaemon]:
    daemon = CannedDaemon(short_dir / "c.sock", {"result": msgspec.to_builtins(REPORT)})
    try:
        yield daemon
    finally:
        daemon.close()


def test_both_clients_send_terminate_and_read_the_report(canned: CannedDaemon) -> None:
    with Client(canned.path) as client:
        assert client.terminate("ses_a", signal="INT", grace_s=0.25) == REPORT

    async def from_async() -> TerminateReport:
        async with AsyncClient(canned.path) as client:
            return await client.terminate("ses_a")

    assert anyio.run(from_async) == REPORT
    assert [(r["method"], r["params"]) for r in canned.requests] == [
        ("session.terminate", {"session_id": "ses_a", "signal": "INT", "grace_ms": 250}),
        ("session.terminate", {"session_id": "ses_a", "signal": "TERM", "grace_ms": 5000}),
    ]


def test_a_grace_out_of_range_is_refused_before_sending(canned: CannedDaemon) -> None:
    with Client(canned.path) as client, pytest.raises(ValueError, match="grace_s"):
        client.terminate("ses_a", grace_s=-1)
    assert canned.requests == []


def test_no_such_session_is_its_own_exception(short_dir: Path) -> None:
    error = {"error": {"code": -32007, "message": "no such session: ses_b is not active"}}
    daemon = CannedDaemon(short_dir / "e.sock", error)
    try:
        with Client(daemon.path) as client, pytest.raises(NoSuchSession) as caught:
            client.terminate("ses_b")
        assert caught.value.code == -32007 and isinstance(caught.value, capsule_client.RemoteError)
        assert main(["terminate", "ses_b", "--socket", str(daemon.path)], out=io.StringIO()) == 1
    finally:
        daemon.close()


def test_capsulectl_terminate_prints_a_table_and_json_as_it_came(canned: CannedDaemon) -> None:
    out = io.StringIO()
    argv = ["terminate", "ses_a", "--signal", "sigkill", "--grace", "0", "--socket"]
    assert main([*argv, str(canned.path)], out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "session ses_a: 3 processes in 5.0 s: 1 exited, 1 killed, 1 refused"
    assert lines[2].split() == ["PID", "KIND", "OUTCOME", "ERROR", "COMMAND"]
    assert lines[3].endswith("exited   -              sh -c 'sleep 9 &'")
    assert lines[4].split() == ["11", "descendant", "killed", "-", "\\_", "sleep", "9"]
    assert lines[5].split()[:5] == ["12", "descendant", "refused", "not", "permitted"]
    assert lines[5].endswith(" \\_ [parent 77 exited] python -m http.server")
    assert canned.requests[-1]["params"] == {
        "session_id": "ses_a",
        "signal": "KILL",
        "grace_ms": 0,
        "commands": True,
    }
    out = io.StringIO()
    assert main(["terminate", "ses_a", "--json", "--socket", str(canned.path)], out=out) == 0
    assert msgspec.json.decode(out.getvalue(), type=TerminateReport) == REPORT


@pytest.mark.parametrize(
    "argv",
    [["terminate"], ["terminate", "s", "--signal", "USR1"], ["terminate", "s", "--grace", "-1"]],
)
def test_capsulectl_terminate_usage_errors_exit_2(argv: list[str]) -> None:
    assert main(argv, out=io.StringIO()) == 2


def test_the_terminate_table_escapes_control_characters() -> None:
    hostile = TerminateReport(
        session_id="ses_\x1b[2Jx\u202e",
        processes=[
            TerminatedProcess(1, 0, "process", "refused", error="line\nbreak\x07"),
        ],
        duration_ms=0,
    )
    text = render_terminate(hostile)
    assert not CONTROL.search(text.replace("\n", "")), repr(text)
    assert "ses_\\x1b[2Jx\\u202e" in text and "line\\nbreak\\x07" in text
    assert (
        render_terminate(TerminateReport("ses_a", [], 0)) == "session ses_a: no process to signal"
    )


def process(pid: int, kind: str = "descendant", parent: int = 0, root: int = 0) -> SessionProcess:
    if kind != "descendant":
        return SessionProcess(kind=kind, pid=pid, started_at=0, receipt_command=f"cmd{pid}")  # type: ignore[arg-type]
    return SessionProcess(
        kind="descendant", pid=pid, started_at=0, parent_pid=parent, root_pid=root
    )


def test_descendants_are_placed_under_their_parents_and_roots() -> None:
    processes = [
        process(5, "exec"),
        process(9, "process"),
        process(20, parent=5, root=5),
        process(21, parent=20, root=5),
        process(22, parent=999, root=9),  # its parent exited: under its root
        process(23, parent=998, root=997),  # its root exited too: last, under nothing
    ]
    assert [(depth, p.pid) for depth, p in nested(processes)] == [
        (0, 5),
        (1, 20),
        (2, 21),
        (0, 9),
        (1, 22),
        (0, 23),
    ]


def snapshot(processes: list[SessionProcess]) -> ActiveSessionsSnapshot:
    return ActiveSessionsSnapshot(
        home="/h",
        observed_at=0.0,
        generation=1,
        task=None,
        discovery="ready",
        sessions=[Session(session_id="ses_a", context_id=None, processes=processes)],
        unowned=[],
        servers=[],
        gaps=[],
        cost=DiscoveryCost(),
    )


def test_sessions_and_top_show_descendants_indented_under_their_root() -> None:
    listed = snapshot([process(5, "exec"), process(20, parent=5, root=5), process(9, "process")])
    for text in (render_sessions(listed, now_s=0.0), render_top(listed, now_s=0.0)):
        rows = [line for line in text.splitlines() if re.search(r"\b(5|20|9)\b", line)]
        assert [re.search(r"\b(5|20|9)\b", row)[0] for row in rows] == ["5", "20", "9"]  # type: ignore[index]
        assert rows[1].endswith(" \\_ started by pid 5"), rows
        assert rows[0].endswith("cmd5") and rows[2].endswith("cmd9"), rows
