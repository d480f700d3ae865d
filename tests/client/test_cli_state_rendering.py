"""What people and models read of a session's state, usage totals and ports
(docs/design.md §13): the tables, ``top``'s order, ``watch``, the MCP answers."""

from __future__ import annotations

import pytest

from capsule_client.cli.render.ports import held_ports, render_ports, unknown_pids
from capsule_client.cli.render.tables import ChangePrinter, render_sessions, render_top
from capsule_client.wire import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    ListeningSocket,
    Session,
    SessionProcess,
    SessionsChanged,
    SessionUsage,
)

NOW = 1_800_000_000.0


def process(pid: int, kind: str = "process", **fields: object) -> SessionProcess:
    return SessionProcess(kind, pid, int(NOW) - 60, command=["job", str(pid)], **fields)  # type: ignore[arg-type]


def snapshot(
    *sessions: Session, unowned: list[SessionProcess] | None = None
) -> ActiveSessionsSnapshot:
    return ActiveSessionsSnapshot(
        home="/h",
        observed_at=NOW,
        generation=9,
        task=None,
        discovery="ready",
        sessions=list(sessions),
        unowned=unowned or [],
        servers=[],
        gaps=[],
        cost=DiscoveryCost(),
    )


def left(pid: int, **fields: object) -> SessionProcess:
    return process(pid, "descendant", parent_pid=1, root_pid=pid - 1, **fields)


def test_the_sessions_table_says_which_session_ended_when_and_what_is_left() -> None:
    ended = Session("ses_old", None, [left(20), left(21)], state="ended", ended_at=NOW - 7300)
    unknown = Session("ses_odd", None, [left(30)], state="ended", ended_at=None)
    running = Session("ses_new", None, [process(10)])
    lines = render_sessions(snapshot(running, ended, unknown), now_s=NOW).splitlines()
    assert lines[0].split()[:3] == ["KIND", "PID", "AGE"]
    assert lines[1] == "ses_new  running"  # each session's line: its id and its state
    assert lines[2].split()[:2] == ["process", "10"]
    assert lines[3] == "ses_old  ended 2h01m ago, 2 left"
    assert [line.split()[:2] for line in lines[4:6]] == [["descendant", "20"], ["descendant", "21"]]
    assert lines[6] == "ses_odd  ended, 1 left"


def _measured(session_id: str, cpu: float, state: str = "running") -> Session:
    return Session(
        session_id,
        None,
        [process(len(session_id) * 10, cpu_percent=cpu, rss_bytes=1 << 20)],
        state=state,  # type: ignore[arg-type]
        ended_at=NOW - 60 if state == "ended" else None,
        usage=SessionUsage(cpu_percent=cpu, rss_bytes=1 << 20, processes=1),
    )


def test_top_puts_the_busiest_session_first_and_an_ended_one_first_among_equals() -> None:
    listed = snapshot(
        _measured("ses_a", 1.0),
        _measured("ses_b", 50.0),
        _measured("ses_c", 1.0, "ended"),
        _measured("ses_d", 0.0),
    )
    lines = render_top(listed, now_s=NOW).splitlines()
    assert "4 sessions (1 ended), 4 processes" in lines[0]
    assert lines[2].split()[:3] == ["PID", "KIND", "CPU%"]
    heads = [line for line in lines[3:] if line.startswith("ses_")]
    assert [h.split()[0] for h in heads] == ["ses_b", "ses_c", "ses_a", "ses_d"]
    assert heads[0] == "ses_b  running  50.0% CPU  1.0M"  # the session's totals
    assert heads[1] == "ses_c  ended 1m00s ago, 1 left  1.0% CPU  1.0M"


def test_top_without_totals_adds_up_the_processes_to_sort() -> None:
    """An older daemon sends no session totals: the order is the processes' sum."""
    quiet = Session("ses_q", None, [process(10, cpu_percent=2.0, rss_bytes=1)])
    busy = Session(
        "ses_z", None, [process(11, cpu_percent=2.0, rss_bytes=1), process(12, cpu_percent=2.0)]
    )
    lines = render_top(snapshot(quiet, busy), now_s=NOW).splitlines()
    heads = [line.split()[0] for line in lines[3:] if line.startswith("ses_")]
    assert heads == ["ses_z", "ses_q"]


def test_watch_shows_a_session_ending() -> None:
    printer = ChangePrinter()
    change = SessionsChanged(
        subscription="sub_1",
        generation=5,
        observed_at=NOW,
        discovery="ready",
        added=[],
        changed=[Session("ses_a", "ctx", [left(20)], state="ended", ended_at=NOW - 3)],
        removed=[],
        unowned=[],
        servers=[],
        gaps=[],
    )
    lines = printer.render(change, now_s=NOW).splitlines()
    assert lines[1] == "  ~ ses_a [ctx]  ended 3s ago, 1 left"


def test_the_ports_table_one_row_per_socket_ipv6_in_brackets() -> None:
    web = process(
        10,
        ports=[
            ListeningSocket("tcp", "::", 3000),
            ListeningSocket("tcp", "0.0.0.0", 3000),
        ],
    )
    other = process(11, ports=None)
    stray = process(12, "exec", ports=[ListeningSocket("udp", "127.0.0.1", 5353)])
    listed = snapshot(Session("ses_a", None, [web, other]), unowned=[stray])
    held = held_ports(listed)
    lines = render_ports(held).splitlines()
    assert [line.split()[:4] for line in lines] == [
        ["PROTO", "ADDRESS", "PID", "SESSION"],
        ["tcp", "[::]:3000", "10", "ses_a"],
        ["tcp", "0.0.0.0:3000", "10", "ses_a"],
        ["udp", "127.0.0.1:5353", "12", "(unowned)"],
    ]
    assert [h.process.pid for h in held_ports(listed, 5353)] == [12]
    assert held_ports(listed, 80) == []
    assert unknown_pids(listed) == [11]


def test_the_mcp_answers_say_a_session_ended_and_what_listens() -> None:
    pytest.importorskip("pydantic")
    from capsule_client.mcp.answers import Caller, sessions_result, sessions_text

    server = left(20, ports=[ListeningSocket("tcp", "::1", 8080)])
    ended = Session(
        "ses_old",
        None,
        [server],
        state="ended",
        ended_at=NOW - 120,
        usage=SessionUsage(cpu_percent=3.5, rss_bytes=2 << 20, processes=1),
    )
    caller = Caller(session_id=None)
    result = sessions_result(snapshot(ended), caller)
    (info,) = result.sessions
    assert (info.state, info.ended_at, info.cpu_percent, info.rss_bytes) == (
        "ended",
        NOW - 120,
        3.5,
        2 << 20,
    )
    (shown,) = info.processes
    assert shown.ports is not None and [(p.proto, p.port) for p in shown.ports] == [("tcp", 8080)]
    text = sessions_text(result, caller)
    assert "ses_old: 1 process — ended 2m00s ago: its own processes are gone" in text
    assert "listening on tcp [::1]:8080" in text
