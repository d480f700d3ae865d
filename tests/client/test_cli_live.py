"""capsulectl watch and top: what people read.

The daemon side is in integration/snapshot/test_live.py.
"""

from __future__ import annotations

import json

from capsule_client.cli.render.tables import ChangePrinter, render_top
from capsule_client.wire import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    Session,
    SessionProcess,
    SessionsChanged,
)

NOW = 1_800_000_000.0


def process(pid: int, **usage: object) -> SessionProcess:
    return SessionProcess(
        kind="exec", pid=pid, started_at=int(NOW) - 90, command=["job", str(pid)], **usage
    )  # type: ignore[arg-type]


def change(generation: int, **fields: object) -> SessionsChanged:
    base: dict[str, object] = {
        "subscription": "sub_1",
        "generation": generation,
        "observed_at": NOW,
        "discovery": "ready",
        "added": [],
        "changed": [],
        "removed": [],
        "unowned": [],
        "servers": [],
        "gaps": [],
    }
    base.update(fields)
    return SessionsChanged(**base)  # type: ignore[arg-type]


def test_watch_prints_each_change_as_a_few_lines() -> None:
    printer = ChangePrinter()
    full = printer.render(
        change(4, full=True, added=[Session("ses_a", "ctx", [process(10)])]), now_s=NOW
    )
    assert "generation 4: 1 active session, discovery ready" in full
    assert full.splitlines()[1:3] == ["  + ses_a [ctx]  running", "      exec  10  job 10"]
    later = printer.render(
        change(5, removed=["ses_a"], gaps=["a gap"], discovery="unavailable"), now_s=NOW
    )
    # Not "ses_a ended": an unavailable answer lists no session, whatever runs.
    assert later.splitlines()[1:] == ["  discovery unavailable: a gap"]


def test_watch_json_is_one_document_per_line() -> None:
    text = ChangePrinter(json_lines=True).render(change(2, removed=["ses_b"]))
    assert text.endswith("\n") and text.count("\n") == 1
    assert json.loads(text)["removed"] == ["ses_b"]


def test_top_shows_cpu_and_memory_per_process() -> None:
    snapshot = ActiveSessionsSnapshot(
        home="/h",
        observed_at=NOW,
        generation=3,
        task=None,
        discovery="ready",
        sessions=[Session("ses_a", None, [process(10, cpu_percent=12.5, rss_bytes=3 << 20)])],
        unowned=[process(11)],
        servers=[],
        gaps=[],
        cost=DiscoveryCost(),
    )
    lines = render_top(snapshot, now_s=NOW).splitlines()
    assert "1 session, 1 process, 1 unowned" in lines[0]
    head = ["PID", "KIND", "CPU%", "RSS", "AGE", "COMMAND"]
    assert lines[2].split() == head
    assert lines[3] == "ses_a  running"  # no totals from this daemon
    assert lines[4].split() == ["10", "exec", "12.5", "3.0M", "1m30s", "job", "10"]
    assert lines[5].split() == ["(unowned)"]
    assert lines[6].split() == ["11", "exec", "-", "-", "1m30s", "job", "11"]


def test_watch_cuts_to_the_width_and_wide_shows_the_receipts() -> None:
    shell = SessionProcess(
        kind="exec",
        pid=10,
        started_at=int(NOW),
        exec_id="exe_build",
        receipt="runtime/exec-processes/exe_build.json",
        command=["sh", "-c", "npm run dev & tsc --watch"],
    )
    child = SessionProcess(
        kind="descendant", pid=11, started_at=int(NOW), parent_pid=10, root_pid=10, command=["tsc"]
    )
    first = change(4, full=True, added=[Session("ses_a", None, [shell, child])])
    lines = ChangePrinter(width=30).render(first, now_s=NOW).splitlines()
    assert lines[2] == "      exec        10  sh -c '…"
    assert lines[3] == "      descendant  11   \\_ tsc"
    wide = ChangePrinter(width=30, wide=True).render(first, now_s=NOW).splitlines()
    assert wide[2].split() == [
        "exec",
        "10",
        "exe_build",
        "runtime/exec-processes/exe_build.json",
        "sh",
        "-c",
        "'npm",
        "run",
        "dev",
        "&",
        "tsc",
        "--watch'",
    ]
