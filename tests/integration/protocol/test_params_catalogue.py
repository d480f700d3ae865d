"""Every parameter of every served method, given every JSON type.

The rules are docs/design.md §7, docs/protocol.md.

The fuzzer draws such requests at random; this catalogue makes sure each
(method, parameter, value) pair is sent at least once, in every CI run, and
answered as :mod:`rpc_model` predicts: -32602 naming the parameter when the
value does not fit, a result or a documented error when it does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import msgspec
import pytest
from helpers.daemon import DaemonProcess, short_tmpdir
from helpers.reliability import exchange, served_models
from models import rpc_model

from capsule_client.wire import METHOD_PARAMS

#: One value of each JSON type and then some: (name, JSON text).
VALUES = [
    ("null", "null"),
    ("true", "true"),
    ("zero", "0"),
    ("negative", "-1"),
    ("float", "1.5"),
    ("integral-float", "5.0"),
    ("int64-max", str(2**63 - 1)),
    ("beyond-u64", str(2**70)),
    ("1e400", "1e400"),
    ("empty-string", '""'),
    ("string", '"ses_catalogue"'),
    ("long-string", '"' + "s" * 5000 + '"'),
    ("nul-string", '"ses_\\u0000"'),
    ("array", "[1]"),
    ("object", '{"a":1}'),
    ("deep", "[" * 2000 + "]" * 2000),
]

#: A value for each parameter that fits, cheap to answer (no long poll).
FITTING: dict[str, dict[str, str]] = {
    "sessions.snapshot": {"timeout_ms": "0"},
    "session.reconcile": {
        "from_session": '"ses_catalogue"',
        "this_session": '"ses_other"',
        "context_id": '"ctx"',
    },
    "session.terminate": {"session_id": '"ses_catalogue"', "grace_ms": "0"},
}


def cases() -> Iterator[tuple[str, str, str, str]]:
    for method, params_type in METHOD_PARAMS.items():
        for field in msgspec.structs.fields(params_type):
            for name, value in VALUES:
                yield method, field.encode_name, name, value


CASES = list(cases())


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[DaemonProcess, dict[str, rpc_model.MethodModel]]]:
    with short_tmpdir() as tmp:
        home = tmp / "home"
        home.mkdir(mode=0o700)
        with DaemonProcess(home, tmp / "p.sock", ["--log-level", "info"]) as daemon:
            yield daemon, served_models(daemon.socket_path)


def test_the_catalogue_covers_every_parameter() -> None:
    fields = {
        (m, f.encode_name) for m, t in METHOD_PARAMS.items() for f in msgspec.structs.fields(t)
    }
    assert {(m, f) for m, f, _, _ in CASES} == fields
    assert fields  # methods with params exist


@pytest.mark.parametrize("method", sorted({m for m, _, _, _ in CASES}))
def test_every_parameter_with_every_type(
    served: tuple[DaemonProcess, dict[str, rpc_model.MethodModel]], method: str
) -> None:
    daemon, models = served
    if method not in models:
        pytest.skip(f"{method} is not served by this daemon")
    lines, ids = [], []
    for m, field, name, value in CASES:
        if m != method:
            continue
        members = {**FITTING.get(method, {}), field: value}
        params = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members.items()) + "}"
        lines.append(
            f'{{"jsonrpc":"2.0","id":{len(lines)},"method":"{method}","params":{params}}}'.encode()
        )
        ids.append(None if name == "deep" else len(lines) - 1)  # too deep: -32700, id null
    payload = b"\n".join(lines) + b"\n"
    received, closed = exchange(daemon.socket_path, payload)
    assert not closed
    rpc_model.check(payload, received, models)
    messages = [json.loads(x) for x in received.splitlines()]
    replies = [m for m in messages if "id" in m]  # not the subscriptions' notifications
    assert [r["id"] for r in replies] == ids
    refused = sum(1 for r in replies if r.get("error", {}).get("code") == -32602)
    assert refused >= len(lines) // 2  # most values do not fit; each refusal was checked
    assert daemon.process is not None and daemon.process.poll() is None


@pytest.mark.parametrize("method", sorted(METHOD_PARAMS))
def test_null_params_and_null_optional_members_are_left_out(
    served: tuple[DaemonProcess, dict[str, rpc_model.MethodModel]], method: str
) -> None:
    """``"params": null`` is answered as no params; every optional member given ``null``
    as the fitting params alone; both as :mod:`rpc_model` predicts."""
    daemon, models = served
    if method not in models:
        pytest.skip(f"{method} is not served by this daemon")
    fitting = FITTING.get(method, {})
    optional = [
        f.encode_name for f in msgspec.structs.fields(METHOD_PARAMS[method]) if not f.required
    ]
    with_nulls = {**{name: "null" for name in optional}, **fitting}

    def members(values: dict[str, str]) -> str:
        return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in values.items()) + "}"

    variants = [
        ',"params":null',
        "",
        f',"params":{members(fitting)}',
        f',"params":{members(with_nulls)}',
    ]
    lines = [
        f'{{"jsonrpc":"2.0","id":{n},"method":"{method}"{params}}}'.encode()
        for n, params in enumerate(variants)
    ]
    payload = b"\n".join(lines) + b"\n"
    received, closed = exchange(daemon.socket_path, payload)
    assert not closed
    rpc_model.check(payload, received, models)
    replies = [m for m in map(json.loads, received.splitlines()) if "id" in m]
    assert [r["id"] for r in replies] == list(range(len(lines)))

    def outcome(reply: dict[str, object]) -> object:
        return reply.get("error", {}) if "error" in reply else "result"  # type: ignore[union-attr]

    assert outcome(replies[0]) == outcome(replies[1]), replies[:2]
    assert outcome(replies[2]) == outcome(replies[3]), replies[2:]
