"""capsulectl's tables print what receipts and traces say without letting it act on a terminal.

Commands, binaries, file names and ids come from files that a model's output
can reach (docs/design.md §3, §6); the human tables (docs/design.md §9) spell
control characters as escapes and keep one row per line. ``--json`` is
untouched: JSON escapes them. Then the layout of the sessions table.
"""

from __future__ import annotations

import re

import msgspec
import pytest

from capsule_client.cli.render.reconcile import render_reconcile
from capsule_client.cli.render.tables import render_sessions
from capsule_client.text import counted, duration
from capsule_client.wire import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    LostReport,
    LostWork,
    Provenance,
    ServerEntry,
    Session,
    SessionProcess,
)
from capsuled.reconcile.prior_session import lost_message

ESC = "\x1b"
C1_CSI = "\x9b"
HOSTILE = f"make{ESC}[2J{C1_CSI}31m\x07 test\r\nrm -rf /\t\x00end"

CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # everything but the table's own \n


def snapshot(receipt_only: bool = False) -> ActiveSessionsSnapshot:
    process = SessionProcess(kind="exec", pid=4242, started_at=0, receipt_command=HOSTILE)
    if not receipt_only:
        process.command = ["sh", "-c", HOSTILE]
    return ActiveSessionsSnapshot(
        home="/home/u/.local/state/capsule",
        observed_at=0.0,
        generation=3,
        task=None,
        discovery="ready",
        sessions=[Session(session_id=f"ses_{ESC}x", context_id=f"ctx\n{ESC}", processes=[process])],
        unowned=[],
        servers=[ServerEntry(pid=77, url=f"http://h/{ESC}]0;title\x07")],
        gaps=[f"/home/u/runs/r/{ESC}[31mred.json: not a regular file"],
        cost=DiscoveryCost(),
    )


@pytest.mark.parametrize("receipt_only", [False, True], ids=["argv", "receipt"])
def test_the_sessions_table_escapes_control_characters(receipt_only: bool) -> None:
    text = render_sessions(snapshot(receipt_only), now_s=10.0)
    assert not CONTROL.search(text), repr(text)
    lines = text.splitlines()
    [row] = [line for line in lines if "4242" in line]
    assert "make\\x1b[2J\\x9b31m\\x07 test\\r\\nrm -rf /\\t\\x00end" in row
    heading = lines[lines.index(row) - 1]  # the session's own line, above its processes
    assert heading.startswith("ses_\\x1bx [ctx\\n\\x1b]")
    assert "gap:       /home/u/runs/r/\\x1b[31mred.json: not a regular file" in lines
    assert "server:    pid 77 http://h/\\x1b]0;title\\x07" in lines


def test_the_reconcile_table_escapes_control_characters() -> None:
    report = LostReport(
        started_in_session="ses_a",
        lost=[
            LostWork(
                work_id=f"wrk\n{ESC}", binary=f"/bin/sh{ESC}[8m", command=HOSTILE, detached_at_ms=0
            )
        ],
        context_id="ctx",
        provenance=Provenance(origin="completion", trust="untrusted"),
        task_id="tsk_0",
        message="",
    )
    text = render_reconcile("ses_a", report)
    assert not CONTROL.search(text), repr(text)
    row = text.splitlines()[-1]
    assert row.startswith("wrk\\n\\x1b")
    assert "/bin/sh\\x1b[8m" in row
    assert row.endswith("rm -rf /\\t\\x00end")


def test_plain_text_and_backslashes_read_as_before() -> None:
    report = LostReport(
        started_in_session="ses_a",
        lost=[LostWork(work_id="wrk_1", binary="sh", command='echo "a\\b"', detached_at_ms=0)],
        context_id="ctx",
        provenance=Provenance(origin="completion", trust="trusted"),
        task_id="tsk_0",
        message="",
    )
    row = render_reconcile("ses_a", report).splitlines()[-1]
    assert row.split() == ["wrk_1", "not", "recorded", "sh", "echo", '"a\\\\b"']


def test_bidi_overrides_and_unicode_line_breaks_are_spelt_as_escapes() -> None:
    """U+202E turns the rest of a line around on the screen ("gnp.exe" reads "exe.png")."""
    tricky = "a\u202egnp.exe\u2066b\u2028c\u2029d\u200fe"
    process = SessionProcess(kind="exec", pid=4242, started_at=0, command=[tricky])
    shown = render_sessions(
        msgspec.structs.replace(
            snapshot(), sessions=[Session(session_id="ses_b", context_id=None, processes=[process])]
        ),
        now_s=10.0,
    )
    [row] = [line for line in shown.splitlines() if "4242" in line]
    assert row.endswith("'a\\u202egnp.exe\\u2066b\\u2028c\\u2029d\\u200fe'"), row


def test_the_table_and_the_report_text_show_a_detach_time_alike() -> None:
    work = LostWork(work_id="wrk_1", binary="sh", command="sleep 9", detached_at_ms=1764400000123)
    report = LostReport(
        started_in_session="ses_a",
        lost=[work],
        context_id="ctx",
        provenance=Provenance(origin="completion", trust="trusted"),
        task_id="tsk_0",
        message=lost_message("ses_a", [work]),
    )
    row = render_reconcile("ses_a", report).splitlines()[-1]
    assert row.split()[1] == "2025-11-29T07:06:40.123Z"
    assert "1764400000123 ms since the Unix epoch (2025-11-29T07:06:40.123Z)" in report.message


# --------------------------------------------------------------------------
# The sessions table's layout


NOW = 1_800_000_000.0


def snapshot_of(**fields: object) -> ActiveSessionsSnapshot:
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


def layout_snapshot() -> ActiveSessionsSnapshot:
    return snapshot_of(
        sessions=[
            Session(
                "ses_a",
                "ctx_a",
                [
                    SessionProcess(
                        "exec",
                        10,
                        int(NOW) - 75,
                        exec_id="exe_build",
                        receipt_command="make",
                        receipt="runtime/exec-processes/exe_build.json",
                        command=["sh", "-c", "npm run dev & (tsc --watch &)"],
                    ),
                    SessionProcess(
                        "provider_client",
                        11,
                        int(NOW) - 4000,
                        input_id="inp_x",
                        provider="oc",
                        receipt="runs/r/inp_x/provider-clients/c.json",
                        command=None,
                    ),
                    SessionProcess(
                        "descendant",
                        20,
                        int(NOW) - 70,
                        parent_pid=10,
                        root_pid=10,
                        command=["npm", "run", "dev"],
                    ),
                    SessionProcess(
                        "descendant",
                        21,
                        int(NOW) - 69,
                        parent_pid=20,
                        root_pid=10,
                        command=["node", "server.js", "--port", "3000"],
                    ),
                    SessionProcess(
                        "descendant",
                        23,
                        int(NOW) - 70,
                        parent_pid=1,
                        root_pid=10,
                        command=["sleep", "60"],
                    ),
                    SessionProcess(
                        "descendant",
                        22,
                        int(NOW) - 70,
                        parent_pid=19,
                        root_pid=10,
                        command=["tsc", "--watch"],
                    ),
                ],
            ),
            Session("ses_b", None, [SessionProcess("process", 12, int(NOW))]),
        ],
        unowned=[SessionProcess("exec", 13, int(NOW), exec_id="stray")],
        servers=[ServerEntry(14, url="http://127.0.0.1:4096")],
        gaps=["/h/runs/x: not a regular file"],
    )


def test_sessions_table_lists_command_lines_as_a_tree() -> None:
    table = render_sessions(layout_snapshot(), now_s=NOW)
    assert table.splitlines() == [
        "  KIND             PID  AGE    COMMAND",
        "ses_a [ctx_a]  running",
        "  exec              10  1m15s  sh -c 'npm run dev & (tsc --watch &)'",
        "  descendant        20  1m10s   \\_ npm run dev",
        "  descendant        21  1m09s      \\_ node server.js --port 3000",
        "  descendant        23  1m10s   \\_ [parent exited] sleep 60",
        "  descendant        22  1m10s   \\_ [parent 19 exited] tsc --watch",
        "  provider_client   11  1h06m  oc (inp_x)",
        "ses_b  running",
        "  process           12  0s     registered process",
        "",
        "unowned:   1 live receipt nobody owns",
        "server:    pid 14 http://127.0.0.1:4096",
        "discovery: ready (generation 7, observed 1s ago)",
        "gap:       /h/runs/x: not a regular file",
    ]


def test_sessions_table_is_cut_to_the_width_and_whole_when_wide() -> None:
    table = render_sessions(layout_snapshot(), now_s=NOW, width=60).splitlines()
    assert table[2] == "  exec              10  1m15s  sh -c 'npm run dev & (tsc --…"
    assert all(len(line) <= 60 for line in table)
    assert table[-1] == "gap:       /h/runs/x: not a regular file"  # only the rows are cut
    wide = render_sessions(layout_snapshot(), now_s=NOW, width=60, wide=True).splitlines()
    assert wide[0].split() == ["KIND", "PID", "AGE", "ID", "RECEIPT", "COMMAND"]
    assert wide[2].split()[3:6] == ["exe_build", "runtime/exec-processes/exe_build.json", "sh"]
    assert wide[2].endswith("sh -c 'npm run dev & (tsc --watch &)'")
    assert "inp_x (oc)" in wide[7] and "runs/r/inp_x/provider-clients/c.json" in wide[7]


def test_an_empty_scanning_snapshot_says_so() -> None:
    table = render_sessions(
        snapshot_of(discovery="scanning", gaps=["session discovery is catching up"]), now_s=NOW
    )
    assert table.splitlines()[0] == "no active sessions"
    assert "unowned:   0 live receipts nobody owns" in table
    assert "discovery: scanning (generation 7" in table
    assert table.endswith("gap:       session discovery is catching up")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.3, "0s"), (0.99, "0s"), (1.5, "1s"), (59.99, "59s"), (119.7, "1m59s"), (3599.9, "59m59s")],
)
def test_ages_are_cut_to_whole_units_never_rounded_up(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_a_descendant_never_reads_older_than_its_parent() -> None:
    """Ages are cut alike (docs/design.md §7): a later start never shows a larger age."""
    starts = [NOW - 0.3, NOW - 0.6, NOW - 61.4, NOW - 61.6]
    ages = [duration(NOW - round(start)) for start in starts]
    seconds = [int(age.removesuffix("s").split("m")[-1]) + 60 * ("m" in age) for age in ages]
    assert seconds == sorted(seconds)


@pytest.mark.parametrize(
    ("n", "noun", "said"),
    [
        (0, "process", "0 processes"),
        (1, "process", "1 process"),
        (2, "process", "2 processes"),
        (1, "session", "1 session"),
        (3, "session", "3 sessions"),
    ],
)
def test_counts_are_singular_only_for_one(n: int, noun: str, said: str) -> None:
    assert counted(n, noun) == said
