"""Kinds of trace line the bad-input catalogue found the scan mishandling (SPEC §6 "Scan")."""

from __future__ import annotations

import pytest

from capsuled.reconcile import scan_lines

DETACHED = b'{"event_type":"shell_detached","work_id":"wrk_%s","binary":"sh"%s}'


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
    scan = scan_lines([DETACHED % (b"a", member), DETACHED % (b"b", b"")])
    assert sorted(scan.detached) == ["wrk_a", "wrk_b"]
    assert scan.detached["wrk_a"].work.detached_at_ms == 0
    assert scan.skipped_lines == 0


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_a_record_nested_past_the_decoder_is_skipped_and_the_rest_counts(depth: int) -> None:
    """Kind: a RecursionError from one line failed the whole scan (-32603 forever)."""
    deep = b'{"event_type":"shell_completed","work_id":"wrk_a","x":%s}' % (
        b"[" * depth + b"]" * depth
    )
    scan = scan_lines([DETACHED % (b"a", b""), deep, DETACHED % (b"b", b"")])
    assert sorted(w.work.work_id for w in scan.unaccounted()) == ["wrk_a", "wrk_b"]
    assert scan.skipped_lines == 1
