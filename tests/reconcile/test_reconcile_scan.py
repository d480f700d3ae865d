"""The trace scan (docs/design.md §6 "Scan"): tolerant, streaming, and exactly "decode every line".

The oracle below decodes every line on its own and applies docs/design.md §6's rules in
the plainest way; the scan must agree with it on any input, including lines
whose names are spelt with JSON ``\\u`` escapes, so that a pre-filter that
looks for the literal bytes ``shell_detached`` (or ``"event_type"``) fails here.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsuled.reconcile.prior_session import reconcile
from capsuled.reconcile.trace_scan import TraceScan, scan_lines, scan_trace

# --------------------------------------------------------------------------
# The oracle


def u64_or_zero(value: Any) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64
    return value if ok else 0


def oracle(data: bytes) -> dict[str, Any]:
    """docs/design.md §6's scan, one msgspec decode per ``\\n``-separated line, no shortcuts."""
    session_event_id = None
    detached: dict[str, tuple[str, str, int, str | None]] = {}
    accounted: set[str] = set()
    trust: dict[str, str] = {}
    for line in data.split(b"\n"):
        try:
            record = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        if not isinstance(record, dict):
            continue
        kind = record.get("event_type")

        def text(key: str, record: dict[str, Any] = record) -> str | None:
            value = record.get(key)
            return value if isinstance(value, str) else None

        if kind == "session_start":
            session_event_id = text("event_id")
        elif kind == "task_start":
            if text("task_id") is not None and record.get("trust") in ("trusted", "untrusted"):
                trust[record["task_id"]] = record["trust"]
        elif kind == "shell_detached":
            work_id = text("work_id")
            if work_id is None:
                continue
            stamp = u64_or_zero(record.get("timestamp"))
            detached[work_id] = (
                text("binary") or "",
                text("command") or "",
                stamp,
                text("task_id"),
            )
        elif kind in ("shell_completed", "shell_abandoned", "shell_lost"):
            work_id = text("work_id")
            if work_id is not None:
                accounted.add(work_id)
    return {
        "session_event_id": session_event_id,
        "detached": detached,
        "accounted": accounted,
        "trust": trust,
        "unaccounted": sorted(set(detached) - accounted),
    }


def summary(scan: TraceScan) -> dict[str, Any]:
    return {
        "session_event_id": scan.session_event_id,
        "detached": {
            work_id: (d.work.binary, d.work.command, d.work.detached_at_ms, d.task_id)
            for work_id, d in scan.detached.items()
        },
        "accounted": scan.accounted,
        "trust": scan.task_trust,
        "unaccounted": [d.work.work_id for d in scan.unaccounted()],
    }


def scanned(tmp_path: Path, data: bytes) -> dict[str, Any]:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(data)
    result = summary(scan_trace(path))
    assert result == summary(scan_lines(data.splitlines(keepends=True)))
    return result


def escaped(value: Any) -> str:
    """JSON with every character of every string, keys included, written as ``\\uXXXX``."""
    if isinstance(value, str):
        return (
            '"'
            + "".join(json.dumps(c)[1:-1] if ord(c) > 0xFFFF else f"\\u{ord(c):04x}" for c in value)
            + '"'
        )
    if isinstance(value, dict):
        return "{" + ",".join(f"{escaped(k)}:{escaped(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(escaped(v) for v in value) + "]"
    return json.dumps(value)


def line(**record: Any) -> str:
    return json.dumps(record, separators=(",", ":"))


START = line(event_type="session_start", event_id="evt_s", session_id="ses_p", timestamp=1)
TASK = line(event_type="task_start", event_id="evt_t", task_id="tsk_1", trust="trusted")
DETACHED = line(
    event_type="shell_detached",
    event_id="evt_d",
    timestamp=1750,
    task_id="tsk_1",
    work_id="wrk_one",
    binary="/usr/bin/bash",
    command="sleep 60",
)


# --------------------------------------------------------------------------
# Escapes: what a too-narrow pre-filter would miss


def test_an_event_type_spelt_with_escapes_still_counts(tmp_path: Path) -> None:
    completed = '{"event_type":"shell\\u005fcompleted","work_id":"wrk_one"}'
    assert b"shell_completed" not in completed.encode()

    result = scanned(tmp_path, f"{START}\n{TASK}\n{DETACHED}\n{completed}\n".encode())

    assert result["accounted"] == {"wrk_one"}
    assert result["unaccounted"] == []


def test_escaped_keys_still_count(tmp_path: Path) -> None:
    detached = (
        '{"\\u0065vent_type":"shell_detached","work\\u005fid":"wrk_two",'
        '"task_id":"tsk_1","timestamp":5}'
    )
    assert b'"event_type"' not in detached.encode()

    result = scanned(tmp_path, f"{START}\n{TASK}\n{detached}\n".encode())

    assert result["unaccounted"] == ["wrk_two"]
    assert result["detached"]["wrk_two"] == ("", "", 5, "tsk_1")


def test_a_record_with_every_character_escaped_counts_like_the_plain_one(tmp_path: Path) -> None:
    records = [json.loads(text) for text in (START, TASK, DETACHED)]
    records.append({"event_type": "shell_abandoned", "work_id": "wrk_one"})
    plain = "".join(json.dumps(r) + "\n" for r in records).encode()
    fully_escaped = "".join(escaped(r) + "\n" for r in records).encode()
    for needle in (b"shell_", b"_start", b"event_type", b"wrk_one"):
        assert needle not in fully_escaped

    assert scanned(tmp_path, fully_escaped) == scanned(tmp_path, plain)
    assert scanned(tmp_path, fully_escaped)["accounted"] == {"wrk_one"}


def test_an_escaped_detach_reaches_the_report(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "ses_p").mkdir(parents=True)
    detached = json.loads(DETACHED)
    (root / "ses_p" / "trace.jsonl").write_text(f"{START}\n{TASK}\n{escaped(detached)}\n")

    report = reconcile(root, "ses_p", "ses_q", "ctx")

    assert report is not None
    assert [(w.work_id, w.binary, w.command, w.detached_at_ms) for w in report.lost] == [
        ("wrk_one", "/usr/bin/bash", "sleep 60", 1750)
    ]


# --------------------------------------------------------------------------
# Tolerance


def test_garbage_nul_runs_and_invalid_utf8_are_skipped_and_the_rest_counts(
    tmp_path: Path,
) -> None:
    data = b"\n".join(
        [
            b"\0" * 4096,
            START.encode(),
            b"garbage {\x01",
            TASK.encode(),
            b"\0\0\0" + line(event_type="shell_lost", work_id="wrk_one").encode(),
            b"\xff\xfe not utf-8",
            DETACHED.encode(),
            # A completion whose command is not UTF-8: not a JSON text, so it accounts for nothing.
            b'{"event_type":"shell_completed","work_id":"wrk_one","command":"\xff"}',
            b"",
            b"   ",
            b'{"event_type":"shell_abandoned","work_id":"wrk_one"',
        ]
    )

    scan = scan_lines(data.splitlines(keepends=True))

    assert [d.work.work_id for d in scan.unaccounted()] == ["wrk_one"]
    assert scan.session_event_id == "evt_s"
    assert scan.task_trust == {"tsk_1": "trusted"}
    assert scan.skipped_lines == 8
    assert scanned(tmp_path, data) == oracle(data)


@pytest.mark.parametrize("not_an_object", ['["shell_lost"]', '"shell_lost"', "null", "1", "{}"])
def test_json_that_is_not_an_event_object_accounts_for_nothing(
    tmp_path: Path, not_an_object: str
) -> None:
    data = f"{START}\n{TASK}\n{DETACHED}\n{not_an_object}\n".encode()

    assert scanned(tmp_path, data)["unaccounted"] == ["wrk_one"]


def test_members_of_the_wrong_type_count_as_absent(tmp_path: Path) -> None:
    data = "\n".join(
        [
            START,
            line(event_type="session_start", event_id=7),
            line(event_type="task_start", task_id="tsk_1", trust="trusted"),
            line(event_type="task_start", task_id="tsk_1", trust="TRUSTED"),
            line(event_type="task_start", task_id=1, trust="untrusted"),
            line(event_type="shell_detached", work_id=1, task_id="tsk_1"),
            line(
                event_type="shell_detached", work_id="wrk_a", binary=1, command=["x"], timestamp="9"
            ),
            line(event_type="shell_detached", work_id="wrk_b", task_id=5, timestamp=-1),
            line(event_type="shell_detached", work_id="wrk_c", task_id="tsk_1", timestamp=1.5),
            line(event_type="shell_detached", work_id="wrk_d", task_id="tsk_1", timestamp=True),
            line(event_type="shell_detached", work_id="wrk_e", task_id="tsk_1", timestamp=2**64),
            line(
                event_type="shell_detached", work_id="wrk_f", task_id="tsk_1", timestamp=2**64 - 1
            ),
            line(event_type="shell_completed", work_id=["wrk_a"]),
            line(event_type=["shell_lost"], work_id="wrk_a"),
            line(event_type={"shell_lost": 1}, work_id="wrk_a"),
            line(event_type=None, work_id="wrk_a"),
        ]
    ).encode()

    scan = scan_lines(data.splitlines())

    assert scan.session_event_id is None, "the last session_start wins, even without an id"
    assert scan.task_trust == {"tsk_1": "trusted"}
    works = {d.work.work_id: d for d in scan.unaccounted()}
    assert sorted(works) == ["wrk_a", "wrk_b", "wrk_c", "wrk_d", "wrk_e", "wrk_f"]
    assert (works["wrk_a"].work.binary, works["wrk_a"].work.command) == ("", "")
    assert [works[w].work.detached_at_ms for w in sorted(works)] == [0, 0, 0, 0, 0, 2**64 - 1]
    assert works["wrk_b"].task_id is None
    assert scan.trust_of(["wrk_c"]) == "trusted"
    assert scan.trust_of(["wrk_c", "wrk_b"]) == "untrusted"
    assert scanned(tmp_path, data) == oracle(data)


def test_a_later_detach_of_the_same_work_replaces_the_earlier(tmp_path: Path) -> None:
    later = line(
        event_type="shell_detached",
        work_id="wrk_one",
        task_id="tsk_9",
        timestamp=2000,
        binary="/bin/zsh",
        command="sleep 5",
    )

    scan = scan_lines(f"{START}\n{TASK}\n{DETACHED}\n{later}\n".encode().splitlines())

    (only,) = scan.unaccounted()
    assert (only.work.binary, only.work.command, only.work.detached_at_ms) == (
        "/bin/zsh",
        "sleep 5",
        2000,
    )
    assert only.task_id == "tsk_9"
    assert scan.trust_of(["wrk_one"]) == "untrusted", "tsk_9 never started"


def test_duplicate_keys_in_one_record_take_the_last(tmp_path: Path) -> None:
    twice = '{"event_type":"shell_completed","work_id":"wrk_one","event_type":"shell_output"}'

    result = scanned(tmp_path, f"{START}\n{TASK}\n{DETACHED}\n{twice}\n".encode())

    assert result["unaccounted"] == ["wrk_one"]


def test_crlf_line_ends_are_read_as_lines(tmp_path: Path) -> None:
    data = f"{START}\r\n{TASK}\r\n{DETACHED}\r\n".encode()

    result = scanned(tmp_path, data)

    assert result["unaccounted"] == ["wrk_one"]
    assert result["detached"]["wrk_one"][3] == "tsk_1"


def test_very_long_lines_are_read_whole(tmp_path: Path) -> None:
    command = "x" * (8 * 1024 * 1024)
    long_detach = line(event_type="shell_detached", work_id="wrk_long", command=command)
    data = f"{START}\n{'#' * (8 * 1024 * 1024)}\n{long_detach}\n{DETACHED}\n".encode()

    result = scanned(tmp_path, data)

    assert result["unaccounted"] == ["wrk_long", "wrk_one"]
    assert len(result["detached"]["wrk_long"][1]) == len(command)


def test_the_scan_streams_memory_is_bounded_by_the_longest_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    filler = line(event_type="model_output", text="y" * 2000) + "\n"
    with path.open("w") as trace:
        trace.write(f"{START}\n{TASK}\n{DETACHED}\n")
        trace.write(filler * 12_000)  # 24 MB
    size = path.stat().st_size
    assert size > 20_000_000

    tracemalloc.start()
    try:
        scan = scan_trace(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert [d.work.work_id for d in scan.unaccounted()] == ["wrk_one"]
    assert scan.bytes == size
    assert peak < 4 * 1024 * 1024, f"peak {peak} bytes for a {size}-byte trace"


# --------------------------------------------------------------------------
# Property: the scan equals the oracle on any mixture


names = st.sampled_from(
    [
        "session_start",
        "task_start",
        "shell_detached",
        "shell_completed",
        "shell_abandoned",
        "shell_lost",
        "shell_output",
        "turn_start",
        "",
    ]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 + 5),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
members = {
    "event_type": st.one_of(names, scalars, st.lists(names, max_size=1)),
    "event_id": st.one_of(st.sampled_from(["evt_a", "evt_b"]), scalars),
    "work_id": st.one_of(st.sampled_from(["wrk_a", "wrk_b", "wrk_c"]), scalars),
    "task_id": st.one_of(st.sampled_from(["tsk_1", "tsk_2"]), scalars),
    "trust": st.one_of(st.sampled_from(["trusted", "untrusted"]), scalars),
    "timestamp": st.one_of(st.integers(min_value=0, max_value=2**64 - 1), scalars),
    "binary": st.one_of(st.just("/bin/sh"), scalars),
    "command": st.one_of(st.text(max_size=12), scalars),
    "text": st.text(max_size=20),
}
records = st.fixed_dictionaries(
    {"event_type": members["event_type"]},
    optional={k: v for k, v in members.items() if k != "event_type"},
)


@st.composite
def trace_lines(draw: st.DrawFn) -> bytes:
    record = draw(records)
    form = draw(st.sampled_from(["compact", "ascii", "escaped", "torn", "garbage", "nul", "bad"]))
    if form == "compact":
        return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
    if form == "ascii":
        return json.dumps(record, ensure_ascii=True, indent=None).encode()
    if form == "escaped":
        return escaped(record).encode()
    encoded = json.dumps(record, ensure_ascii=False).encode()
    if form == "torn":
        return encoded[: draw(st.integers(min_value=0, max_value=len(encoded)))]
    if form == "nul":
        return b"\0" * draw(st.integers(min_value=1, max_value=64)) + encoded
    if form == "bad":
        cut = draw(st.integers(min_value=0, max_value=len(encoded)))
        return encoded[:cut] + b"\xc3\x28" + encoded[cut:]
    return draw(st.binary(max_size=40)).replace(b"\n", b"")


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(trace_lines(), max_size=25),
    line_end=st.sampled_from([b"\n", b"\r\n"]),
    final_newline=st.booleans(),
)
def test_the_scan_equals_decoding_every_line(
    tmp_path: Path, lines: list[bytes], line_end: bytes, final_newline: bool
) -> None:
    data = line_end.join(lines) + (line_end if final_newline and lines else b"")

    assert scanned(tmp_path, data) == oracle(data)


# --------------------------------------------------------------------------
# Lines the bad-input catalogue found the scan mishandling


DETACHED_WITH = b'{"event_type":"shell_detached","work_id":"wrk_%s","binary":"sh"%s}'


@pytest.mark.parametrize(
    "member",
    [
        b',"timestamp":1e400',
        b',"timestamp":-1e400',
        b',"other":1e400',
        b',"other":[1,{"x":-1E+999}]',
        b',"timestamp":1e-400',
        b',"timestamp":' + b"9" * 500,
    ],
)
def test_a_record_holding_a_number_no_float_can_hold_still_counts(member: bytes) -> None:
    """Kind: a valid JSON object was skipped because one number overflowed a float."""
    scan = scan_lines([DETACHED_WITH % (b"a", member), DETACHED_WITH % (b"b", b"")])
    assert sorted(scan.detached) == ["wrk_a", "wrk_b"]
    assert scan.detached["wrk_a"].work.detached_at_ms == 0
    assert scan.skipped_lines == 0


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_a_record_nested_past_the_decoder_is_skipped_and_the_rest_counts(depth: int) -> None:
    """Kind: a RecursionError from one line failed the whole scan (-32603 forever)."""
    deep = b'{"event_type":"shell_completed","work_id":"wrk_a","x":%s}' % (
        b"[" * depth + b"]" * depth
    )
    scan = scan_lines([DETACHED_WITH % (b"a", b""), deep, DETACHED_WITH % (b"b", b"")])
    assert sorted(w.work.work_id for w in scan.unaccounted()) == ["wrk_a", "wrk_b"]
    assert scan.skipped_lines == 1
