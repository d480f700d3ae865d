"""Bad-input catalogues, data-driven, through the real daemon (docs/design.md §3, §5, §6).

Traces: each entry puts hostile bytes between good records of a prior
session and says which works must be reported lost. The daemon must skip
what is not a JSON object, count the records above and below it, leave
every byte it found in place, and start its markers on a fresh line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.daemon import DaemonProcess, short_tmpdir
from helpers.reliability import FULL, FULL_TIMEOUT_S, record, size

pytestmark = pytest.mark.timeout(FULL_TIMEOUT_S if FULL else 60)

MiB = 1024 * 1024


def line(**fields: Any) -> bytes:
    return json.dumps(fields, ensure_ascii=False).encode() + b"\n"


def detached(work_id: str, command: str = "sleep 1", **extra: Any) -> bytes:
    return line(
        event_type="shell_detached",
        event_id=f"evt_{work_id}",
        session_id="ses_x",
        timestamp=1_700_000_000_000,
        task_id="tsk_a",
        work_id=work_id,
        binary="/bin/sh",
        command=command,
        **extra,
    )


def completed(work_id: str) -> bytes:
    return line(event_type="shell_completed", work_id=work_id, binary="/bin/sh", command="")


HEAD = (
    line(event_type="session_start", event_id="evt_start", session_id="ses_x")
    + line(event_type="task_start", task_id="tsk_a", trust="trusted")
    + detached("wrk_above")
    + detached("wrk_done")
)
TAIL = detached("wrk_below") + completed("wrk_done")


@dataclass(frozen=True)
class TraceCase:
    """Hostile bytes between good records, and what must be reported lost."""

    name: str
    bad: bytes
    lost: frozenset[str] = frozenset({"wrk_above", "wrk_below"})
    head: bytes = HEAD
    tail: bytes = TAIL
    parent_id: str | None = "evt_start"


def _u(text: str) -> bytes:
    return text.encode()


TRACES = [
    TraceCase("nul-run", b"\0" * 4096 + b"\n"),
    TraceCase("nul-inside-a-line", b'{"event_type":"shell_detached",\0"work_id":"wrk_nul"}\n'),
    # A crash can leave the tail of a file zero-filled, without a newline.
    TraceCase("nul-run-at-the-tail", b"", tail=TAIL + b"\0" * 4096),
    TraceCase("invalid-utf8", b'{"event_type":"shell_detached","work_id":"wrk_\xff\xfe"}\n'),
    TraceCase(
        "invalid-utf8-hides-a-completion",
        b'{"event_type":"shell_completed","work_id":"wrk_done","x":"\xc3\x28"}\n',
        tail=detached("wrk_below"),
        lost=frozenset({"wrk_above", "wrk_below", "wrk_done"}),
    ),
    TraceCase("surrogate-escape", b'{"event_type":"shell_detached","work_id":"\\ud800"}\n'),
    TraceCase(
        "line-separators-inside-strings",
        detached("wrk_u2028", "echo a\u2028b\u2029c\x85d\x1ce\x1df\x1eg\x0bh\x0ci"),
        lost=frozenset({"wrk_above", "wrk_below", "wrk_u2028"}),
    ),
    TraceCase(
        "a-3-MiB-record",
        detached("wrk_big", "x" * (3 * MiB)),
        lost=frozenset({"wrk_above", "wrk_below", "wrk_big"}),
    ),
    TraceCase("a-3-MiB-garbage-line", b"{" * (3 * MiB) + b"\n"),
    TraceCase("a-3-MiB-line-of-nesting", b"[" * (3 * MiB) + b"]" * (3 * MiB) + b"\n"),
    TraceCase(
        "deep-nesting-in-a-record",
        b'{"event_type":"shell_detached","work_id":"wrk_deep","x":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}\n",
    ),  # cannot be read (deeper than the decoder recurses): skipped like garbage
    TraceCase("torn-record", b'{"event_type":"shell_detached","work_id":"wrk_torn","bin\n'),
    TraceCase("torn-tail", b"", tail=TAIL + b'{"event_type":"shell_completed","work_id":"wrk_ab'),
    TraceCase(
        "crlf",
        detached("wrk_crlf")[:-1] + b"\r\n",
        lost=frozenset({"wrk_above", "wrk_below", "wrk_crlf"}),
    ),
    TraceCase("not-objects", b'[1,2]\n"shell_detached"\n42\nnull\ntrue\n{}\n'),
    TraceCase("work-id-not-a-string", b'{"event_type":"shell_detached","work_id":7}\n'),
    TraceCase(
        "wrong-member-types",
        line(
            event_type="shell_detached",
            work_id="wrk_odd",
            binary=5,
            command=["no"],
            timestamp="yesterday",
            task_id=None,
        ),
        lost=frozenset({"wrk_above", "wrk_below", "wrk_odd"}),
    ),
    TraceCase(
        "huge-numbers",
        b'{"event_type":"shell_detached","work_id":"wrk_huge","timestamp":1e400}\n'
        b'{"event_type":"shell_detached","work_id":"wrk_huge2","timestamp":' + b"9" * 400 + b"}\n",
        lost=frozenset({"wrk_above", "wrk_below", "wrk_huge", "wrk_huge2"}),
    ),
    TraceCase(
        "utf8-bom-before-the-first-record",
        b"",
        head=b"\xef\xbb\xbf" + HEAD,
        parent_id=None,
    ),
    TraceCase("blank-and-space-lines", b"\n\n   \n\t\n"),
    TraceCase("binary-noise", bytes(range(256)) * 64 + b"\n"),
]


def write_trace(root: Path, case: TraceCase) -> tuple[Path, bytes]:
    directory = root / "ses_x"
    directory.mkdir(mode=0o700, parents=True)
    body = case.head + case.bad + case.tail
    trace = directory / "trace.jsonl"
    trace.write_bytes(body)
    return trace, body


@pytest.fixture(scope="module")
def catalogue_daemon() -> Iterator[DaemonProcess]:
    with short_tmpdir() as tmp:
        home = tmp / "home"
        home.mkdir(mode=0o700)
        with DaemonProcess(home, tmp / "c.sock", ["--log-level", "info"]) as daemon:
            yield daemon


def reconcile(daemon: DaemonProcess, from_session: str, this_session: str) -> dict[str, Any]:
    from helpers.reliability import exchange

    payload = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session.reconcile",
            "params": {
                "from_session": from_session,
                "this_session": this_session,
                "context_id": "ctx",
            },
        }
    ).encode()
    received, _ = exchange(daemon.socket_path, payload + b"\n")
    reply: dict[str, Any] = json.loads(received)
    return reply


@pytest.mark.parametrize("case", TRACES, ids=[c.name for c in TRACES])
def test_trace_catalogue(catalogue_daemon: DaemonProcess, case: TraceCase) -> None:
    root = catalogue_daemon.home / "sessions"
    if (root / "ses_x").exists():
        for child in (root / "ses_x").iterdir():
            child.unlink()
        (root / "ses_x").rmdir()
    trace, body = write_trace(root, case)
    reply = reconcile(catalogue_daemon, "ses_x", "ses_next")
    assert "result" in reply, reply
    report = reply["result"]
    assert report is not None
    assert {w["work_id"] for w in report["lost"]} == case.lost
    after = trace.read_bytes()
    # Nothing the daemon found is changed; its markers follow, on a fresh line.
    assert after.startswith(body)
    appended = after[len(body) :]
    if not body.endswith(b"\n"):
        assert appended.startswith(b"\n")
        appended = appended[1:]
    assert appended.endswith(b"\n")
    marker_lines = appended.split(b"\n")[:-1]
    markers = [json.loads(m) for m in marker_lines]
    assert sorted(m["work_id"] for m in markers) == sorted(case.lost)
    assert all(m["event_type"] == "shell_lost" for m in markers)
    assert {m["parent_id"] for m in markers} == {case.parent_id}
    for work in report["lost"]:
        marker = next(m for m in markers if m["work_id"] == work["work_id"])
        assert marker["command"] == work["command"]
    # Again: nothing new (the retry gets the same report), another session nothing.
    assert reconcile(catalogue_daemon, "ses_x", "ses_next")["result"] == report
    assert reconcile(catalogue_daemon, "ses_x", "ses_third")["result"] is None
    assert trace.read_bytes() == after


def test_line_separators_inside_strings_survive_in_the_report(
    catalogue_daemon: DaemonProcess,
) -> None:
    """U+2028 and friends are not line ends in JSONL; str.splitlines() would say they are."""
    root = catalogue_daemon.home / "sessions"
    directory = root / "ses_sep"
    directory.mkdir(mode=0o700, parents=True)
    command = "echo a\u2028b\u2029c\x85d\x1ce"
    (directory / "trace.jsonl").write_bytes(detached("wrk_sep", command))
    report = reconcile(catalogue_daemon, "ses_sep", "ses_next")["result"]
    assert report["lost"][0]["command"] == command


# --------------------------------------------------------------------------
# Other writers appending while the daemon appends markers


WRITER = r"""
import json, os, sys
from capsule_client.kit.trace import ShellDetached, append_event, new_event_id, now_ms
root, session, name, count, raw = sys.argv[1:6]
count = int(count)
pad = "p" * 8192
path = os.path.join(root, session, "trace.jsonl")
for i in range(count):
    work_id = f"wrk_{name}_{i:05d}"
    if raw == "1":
        # A runtime that takes no lock: one O_APPEND write per whole line.
        data = json.dumps({"event_type": "shell_detached", "session_id": session,
                           "work_id": work_id, "binary": "/bin/sh", "command": pad,
                           "task_id": "tsk_a", "timestamp": now_ms()}).encode() + b"\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    else:
        append_event(root, ShellDetached(event_id=new_event_id(), session_id=session,
                     timestamp=now_ms(), task_id="tsk_a", work_id=work_id,
                     binary="/bin/sh", command=pad))
print("done", flush=True)
"""


@pytest.mark.parametrize("mode", ["kit", "mixed"])
def test_writers_appending_8_KiB_lines_while_markers_are_appended(
    short_dir: Path, mode: str
) -> None:
    """Writers append while reconciles append markers; no line is fused with another.

    ``kit``: every writer takes the trace's lock (docs/design.md §9). ``mixed``: half of
    them write bare ``O_APPEND`` lines without the lock. Such a writer can be
    seen mid-write, which looks like a torn tail: the markers then start on a
    fresh line and, once the write completes, that leaves one blank line. A
    blank line is no record and reconcile skips it; no line is ever fused.
    """
    lines_per_writer = size(150, 2000)
    writers = 4
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    root = home / "sessions"
    (root / "ses_busy").mkdir(mode=0o700, parents=True)
    trace = root / "ses_busy" / "trace.jsonl"
    trace.write_bytes(
        line(event_type="session_start", event_id="evt_s", session_id="ses_busy")
        + line(event_type="task_start", task_id="tsk_a", trust="untrusted")
    )
    reports: list[dict[str, Any]] = []
    with DaemonProcess(home, short_dir / "w.sock", ["--log-level", "info"]) as daemon:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER,
                    str(root),
                    "ses_busy",
                    f"w{n}",
                    str(lines_per_writer),
                    "1" if mode == "mixed" and n % 2 else "0",
                ],
                stdout=subprocess.PIPE,
            )
            for n in range(writers)
        ]
        stop = threading.Event()
        errors: list[str] = []

        def keep_reconciling() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                reply = reconcile(daemon, "ses_busy", f"ses_r{n}")
                if "error" in reply:
                    errors.append(str(reply["error"]))
                elif reply["result"] is not None:
                    reports.append(reply["result"])

        reconciler = threading.Thread(target=keep_reconciling)
        reconciler.start()
        try:
            for proc in procs:
                out, _ = proc.communicate(timeout=FULL_TIMEOUT_S if FULL else 50)
                assert proc.returncode == 0 and out.strip() == b"done"
        finally:
            stop.set()
            reconciler.join()
        final = reconcile(daemon, "ses_busy", "ses_final")["result"]
        if final is not None:
            reports.append(final)
    assert errors == []
    detached_ids = {f"wrk_w{n}_{i:05d}" for n in range(writers) for i in range(lines_per_writer)}
    reported = [w["work_id"] for r in reports for w in r["lost"]]
    assert len(reported) == len(set(reported)), "a work was reported twice"
    assert set(reported) == detached_ids
    # Every line parses as one object: no line fused with another.
    raw_lines = trace.read_bytes().split(b"\n")[:-1]
    blank = sum(1 for x in raw_lines if not x)
    if mode == "kit":
        assert blank == 0
    parsed = [json.loads(x) for x in raw_lines if x]
    assert trace.read_bytes().endswith(b"\n")
    assert all(isinstance(p, dict) for p in parsed)
    kinds = [p["event_type"] for p in parsed]
    assert kinds.count("shell_detached") == len(detached_ids)
    lost_markers = [p["work_id"] for p in parsed if p["event_type"] == "shell_lost"]
    assert sorted(lost_markers) == sorted(detached_ids)
    record(
        f"concurrent_writers_{mode}",
        {
            "title": f"Writers appending while markers are appended ({mode})",
            "text": (
                "Writers append 8 KiB shell_detached lines ("
                + (
                    "all through the writer kit's lock"
                    if mode == "kit"
                    else "half through the writer kit's lock, half as bare O_APPEND writes"
                )
                + ") while reconciles from fresh sessions run back to back. Every non-blank "
                "line of the trace parses as one object afterwards, and every detached work "
                "was reported exactly once."
            ),
            "blank_lines": blank,
            "writers": writers,
            "lines_per_writer": lines_per_writer,
            "reconciles_with_a_report": len(reports),
            "trace_mib": round(os.path.getsize(trace) / MiB, 1),
        },
    )
