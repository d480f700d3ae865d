"""Protocol fuzzing over the real socket of a real daemon (docs/design.md §7, docs/protocol.md).

Hypothesis writes what a client may send — random bytes, random JSON, requests
with every member of the wrong type and every parameter of every method of the
wrong type, deep nesting, huge numbers, invalid UTF-8, lines of exactly 1 MiB
and of 1 MiB + 1, batches of up to 1,000, a last line without its newline —
and :mod:`rpc_model` predicts the answer from the specification. Each example
is one connection; after each, ``ping`` must answer on a fresh one and the
daemon must still run.

Sizes: ``CAPSULED_FUZZ_EXAMPLES`` examples if set, else 300 (CI) or 10,000
(``CAPSULED_HARDENING_FULL=1``). Generation is derandomized with no example
database, so a CI run is the same run every time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers.daemon import DaemonProcess, raw_exchange, short_tmpdir
from helpers.reliability import FULL, FULL_TIMEOUT_S, exchange, record, served_models, size
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import rpc_model

from capsule_client.wire import METHOD_PARAMS

MiB = 1024 * 1024
EXAMPLES = int(os.environ.get("CAPSULED_FUZZ_EXAMPLES") or size(300, 10_000))
PING = b'{"jsonrpc":"2.0","id":"after","method":"ping"}\n'


# --------------------------------------------------------------------------
# JSON text with room for what json.dumps cannot write


@dataclass(frozen=True)
class Token:
    """JSON text written as is: a huge number, a deep nest."""

    text: str


def dump(value: Any) -> str:
    if isinstance(value, Token):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


huge_numbers = st.sampled_from(
    [
        "1e400",
        "-1e400",
        "1e-400",
        "123456789012345678901234567890123456789",
        "-98765432109876543210987654321",
        "18446744073709551616",
        "9223372036854775808",
        "-9223372036854775809",
        "0.000000000000000000000000000000000000000000001",
        "1E+999999999",
        "-0",
        "-0.0e-0",
    ]
).map(Token)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | huge_numbers
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def deep(depth: int, inner: str = "1") -> Token:
    opening = "".join("[" if i % 2 == 0 else '{"k":' for i in range(depth))
    closing = "".join("]" if i % 2 == 0 else "}" for i in reversed(range(depth)))
    return Token(opening + inner + closing)


depths = st.sampled_from([1, 10, 100, 500, 899, 950, 999, 1000, 1001, 2000, 5000, 20_000])


# --------------------------------------------------------------------------
# Requests


def _fields(method: str) -> list[str]:
    return [f.name for f in msgspec.structs.fields(METHOD_PARAMS[method])]


#: Params of the right types, per method, cheap to answer (no long poll, no
#: waiting); "../etc" fits the types and is refused by reconcile itself.
VALID_PARAMS: dict[str, list[dict[str, Any]]] = {
    "ping": [{}],
    "status": [{}],
    "reader.rescan": [{}],
    "metrics": [{}],
    "sessions.snapshot": [
        {"timeout_ms": 0},
        {"timeout_ms": 10, "task": "tsk_fuzz"},
        {"max_age_ms": 60_000, "timeout_ms": 0},
        {"since": 123_456_789, "timeout_ms": 0},
        {"timeout_ms": 0, "usage": True},
    ],
    "sessions.subscribe": [{}, {"since": 123_456_789}],
    "sessions.unsubscribe": [{"subscription": "sub_fuzz"}],
    "session.reconcile": [
        {"from_session": "ses_fuzz", "this_session": "ses_other", "context_id": "ctx"},
        {"from_session": "../etc", "this_session": "ses_x", "context_id": ""},
    ],
    "session.terminate": [
        {"session_id": "ses_fuzz_none"},
        {"session_id": "ses_fuzz_none", "signal": "KILL", "grace_ms": 0},
    ],
}


@st.composite
def params_for(draw: st.DrawFn, method: str) -> Any:
    """Params for ``method``: fitting ones, or one parameter of a random type."""
    base = dict(draw(st.sampled_from(VALID_PARAMS.get(method, [{}]))))
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return base
    if choice == 1:
        return draw(st.sampled_from([[], [1], [base], {}, Token("[ ]")]))
    names = _fields(method) if method in METHOD_PARAMS else []
    if choice == 2 or not names:
        base[draw(st.text(max_size=120))] = draw(json_values)
        return base
    name = draw(st.sampled_from(names))
    if name == "since":
        base["timeout_ms"] = 0  # a since that matches the generation must not long-poll
    if name == "timeout_ms":
        base.pop("since", None)
    base[name] = draw(json_values | huge_numbers | depths.map(deep))
    if choice == 5:
        base.pop(draw(st.sampled_from(names)), None)
    return base


ids = (
    st.integers()
    | st.text(max_size=10)
    | st.none()
    | huge_numbers
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)
method_names = st.sampled_from([*METHOD_PARAMS, "", "no.such", "ping ", "PING", "rpc.discover"])


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A request object; each member is right most of the time, anything otherwise."""
    request: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        request["jsonrpc"] = "2.0"
    elif draw(st.booleans()):
        request["jsonrpc"] = draw(json_values)
    method = draw(method_names)
    if draw(st.integers(0, 9)):
        request["method"] = method
    elif draw(st.booleans()):
        request["method"] = draw(json_values)
    if draw(st.integers(0, 5)):
        request["id"] = draw(ids)
    if draw(st.integers(0, 3)):
        request["params"] = draw(params_for(method))
    elif draw(st.booleans()):
        request["params"] = draw(json_values)
    if not draw(st.integers(0, 9)):
        request[draw(st.text(max_size=5))] = draw(json_values)
    items = list(request.items())
    return dict(draw(st.permutations(items)))


# --------------------------------------------------------------------------
# Lines


INVALID_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80"]


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(
            ["request"] * 6
            + ["batch"] * 2
            + ["json", "bytes", "deep", "utf8", "limit", "big-batch", "escapes"]
        )
    )
    if kind == "request":
        return dump(draw(requests())).encode()
    if kind == "batch":
        return dump(draw(st.lists(requests() | json_values, max_size=6))).encode()
    if kind == "json":
        return dump(draw(json_values)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(depths)
        where = draw(st.sampled_from(["params", "extra", "id", "batch"]))
        nest = deep(depth)
        request = {"jsonrpc": "2.0", "id": 7, "method": draw(method_names)}
        if where == "batch":
            return dump([request, nest]).encode()
        key = {"params": "params", "extra": "x", "id": "id"}[where]
        request[key] = deep(depth, "{}") if where == "params" else nest
        return dump(request).encode()
    if kind == "utf8":
        line = dump(draw(requests())).encode()
        at = draw(st.integers(0, len(line)))
        return line[:at] + draw(st.sampled_from(INVALID_UTF8)) + line[at:]
    if kind == "escapes":
        text = draw(st.sampled_from(["\\ud800", "\\udfff", "\\u0000", "\\u2028", "\\ud83d\\ude00"]))
        return b'{"jsonrpc":"2.0","id":"' + text.encode() + b'","method":"ping"}'
    if kind == "limit":
        length = MiB + draw(st.sampled_from([-1, 0, 1, 2]))
        head = b'{"jsonrpc":"2.0","id":1,"method":"ping","pad":"'
        return head + b"a" * (length - len(head) - 2) + b'"}'
    # big-batch: 1,000 elements, from a handful of drawn ones
    some = draw(st.lists(requests(), min_size=1, max_size=4))
    return dump((some * 1000)[:1000]).encode()


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    chosen = draw(st.lists(lines(), min_size=1, max_size=4))
    payload = b"\n".join(chosen)
    if draw(st.integers(0, 3)):
        payload += b"\n"
    return payload


# --------------------------------------------------------------------------
# The test


@dataclass
class Tally:
    examples: int = 0
    messages: int = 0
    replies: int = 0
    closes: int = 0
    bytes_sent: int = 0
    kinds: dict[str, int] = field(default_factory=dict)


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[tuple[DaemonProcess, dict[str, rpc_model.MethodModel]]]:
    with short_tmpdir() as tmp:
        home = tmp / "home"
        home.mkdir(mode=0o700)
        # Debug logging of every request would dominate the run; info keeps warnings.
        with DaemonProcess(home, tmp / "f.sock", ["--log-level", "info"]) as daemon:
            served = served_models(daemon.socket_path)
            assert {"ping", "status"} <= served.keys()
            yield daemon, served


def _alive(daemon: DaemonProcess) -> None:
    assert daemon.process is not None
    assert daemon.process.poll() is None, f"the daemon died:\n{daemon.logs()[-5000:]}"
    [reply] = raw_exchange(daemon.socket_path, PING).splitlines()
    assert json.loads(reply)["result"]["pong"] is True


@pytest.mark.slow
@pytest.mark.timeout(FULL_TIMEOUT_S if FULL or "CAPSULED_FUZZ_EXAMPLES" in os.environ else 60)
def test_every_message_gets_a_conformant_reply_or_a_documented_close(
    fuzzed: tuple[DaemonProcess, dict[str, rpc_model.MethodModel]],
) -> None:
    daemon, served = fuzzed
    tally = Tally()
    started = time.monotonic()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(payload=payloads())
    def one(payload: bytes) -> None:
        received, _ = exchange(daemon.socket_path, payload)
        prediction = rpc_model.predict(payload, served)
        messages, replies = rpc_model.check(payload, received, served)
        tally.examples += 1
        tally.messages += messages
        tally.replies += replies
        tally.closes += prediction.closes
        tally.bytes_sent += len(payload)
        _alive(daemon)

    one()
    elapsed_s = time.monotonic() - started
    logs = daemon.logs()
    assert "connection failed" not in logs, logs[-5000:]
    assert "request could not be answered" not in logs, logs[-5000:]
    assert '"method raised"' not in logs, logs[-5000:]
    assert tally.examples >= min(EXAMPLES, 100)
    record(
        "fuzz",
        {
            "examples": tally.examples,
            "messages": tally.messages,
            "replies": tally.replies,
            "documented_closes": tally.closes,
            "mib_sent": round(tally.bytes_sent / MiB, 1),
            "elapsed_s": round(elapsed_s, 1),
            "methods": sorted(served),
        },
    )


def test_the_model_knows_every_method_of_the_specification() -> None:
    assert set(rpc_model.METHODS) == set(METHOD_PARAMS)
    for name in METHOD_PARAMS:
        assert name in VALID_PARAMS
    # The model agrees with the wire types on what fits them.
    for name, valid in VALID_PARAMS.items():
        for params in valid:
            msgspec.convert(params, METHOD_PARAMS[name])
            fits = rpc_model.METHODS[name].params(params) is None
            assert fits != (params.get("from_session") == "../etc"), (name, params)


def test_model_sanity(tmp_path: Path) -> None:
    served = {k: rpc_model.METHODS[k] for k in ("ping", "status")}
    prediction = rpc_model.predict(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n[]\nx', served)
    assert len(prediction.lines) == 3 and not prediction.closes
