"""capsulectl's sessions table, rendered from a snapshot (SPEC §9)."""

from __future__ import annotations

from capsule_client._render import render_sessions
from capsule_client.protocol import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    ServerEntry,
    Session,
    SessionProcess,
)

NOW = 1_800_000_000.0


def snapshot(**fields: object) -> ActiveSessionsSnapshot:
    values: dict[str, object] = {
        "home": "/h",
        "observed_at": NOW - 1,
        "generation": 7,
        "task": None,
        "discovery": "ready",
        "sessions": [],
        "unowned": [],
        "servers": [],
        "gaps": [],
        "cost": DiscoveryCost(),
    }
    values.update(fields)
    return ActiveSessionsSnapshot(**values)  # type: ignore[arg-type]


def test_sessions_table_lists_processes_under_their_session() -> None:
    table = render_sessions(
        snapshot(
            sessions=[
                Session(
                    "ses_a",
                    "ctx_a",
                    [
                        SessionProcess("exec", 10, int(NOW) - 75, exec_id="e", command="make"),
                        SessionProcess(
                            "provider_client", 11, int(NOW) - 4000, input_id="inp_x", provider="oc"
                        ),
                    ],
                ),
                Session("ses_b", None, [SessionProcess("process", 12, int(NOW))]),
            ],
            unowned=[SessionProcess("exec", 13, int(NOW), exec_id="stray")],
            servers=[ServerEntry(14, url="http://127.0.0.1:4096")],
            gaps=["/h/runs/x: not a regular file"],
        ),
        now_s=NOW,
    )
    assert table.splitlines() == [
        "SESSION        KIND             PID  AGE    COMMAND / PROVIDER",
        "ses_a [ctx_a]  exec             10   1m15s  make",
        "               provider_client  11   1h06m  oc (inp_x)",
        "ses_b          process          12   0s     registered process",
        "",
        "unowned:   1 live receipt nobody owns",
        "server:    pid 14 http://127.0.0.1:4096",
        "discovery: ready (generation 7, observed 1s ago)",
        "gap:       /h/runs/x: not a regular file",
    ]


def test_an_empty_scanning_snapshot_says_so() -> None:
    table = render_sessions(
        snapshot(discovery="scanning", gaps=["session discovery is catching up"]), now_s=NOW
    )
    assert table.splitlines()[0] == "no active sessions"
    assert "unowned:   0 live receipts nobody owns" in table
    assert "discovery: scanning (generation 7" in table
    assert table.endswith("gap:       session discovery is catching up")
