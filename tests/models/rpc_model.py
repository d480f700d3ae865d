"""A reference model of the wire protocol, written from docs/design.md §7 and docs/protocol.md.

It shares no code with the daemon: it parses with the standard library and
predicts, for any bytes a client sends, which replies come back, in which
order, with which error code and id, and whether the daemon closes the
connection. :func:`check` compares a real exchange with the prediction.

``"params": null`` is the same as no params, and ``null`` for an optional
member the same as leaving it out; ``null`` for a required member is refused.

Where the two JSON parsers may legitimately differ — nesting near the
decoder's depth limit — the model accepts either answer (``Either``).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

MiB = 1024 * 1024
JSON_WHITESPACE = b" \t\r\n"

# Below this nesting depth the daemon must parse; at or above the upper bound
# it must answer -32700 (its decoder recurses, and Python's limit is 1000).
DEPTH_PARSED = 900
DEPTH_REFUSED = 1000

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

_MISSING = object()

#: A params check: ``None`` if the params fit, else the name of the param at fault.
ParamsCheck = Callable[[Any], "str | None"]
#: A result check: raises AssertionError when the result is malformed.
ResultCheck = Callable[[Any], None]


@dataclass(frozen=True)
class MethodModel:
    """What the model knows of one served method."""

    params: ParamsCheck
    result: ResultCheck
    # Error codes the method may answer for params that fit (e.g. -32003).
    errors: frozenset[int] = frozenset()


@dataclass
class Reply:
    """One expected reply object: an error code (or None for a result) and an id."""

    code: int | None
    id: Any
    method: str | None = None
    param: str | None = None


@dataclass
class Single:
    reply: Reply


@dataclass
class Batch:
    replies: list[Reply]


@dataclass
class Either:
    """A line the daemon may parse (answering as ``parsed``) or refuse with -32700."""

    parsed: Single | Batch | None


@dataclass
class Prediction:
    lines: list[Single | Batch | Either | None] = field(default_factory=list)
    closes: bool = False  # the daemon closes after the last predicted line


# --------------------------------------------------------------------------
# Params and results of the methods (docs/design.md §7; capsule_client.wire)


def no_params(params: Any) -> str | None:
    if params is _MISSING or params == {} or params == []:
        return None
    if isinstance(params, dict):
        return next(iter(params))
    return "params"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(value: Any, low: int, high: int | None) -> bool:
    return _is_int(value) and value >= low and (high is None or value <= high)


def _named(
    params: Any, allowed: Mapping[str, Callable[[Any], bool]], required: tuple[str, ...]
) -> str | None:
    if params is _MISSING:
        params = {}
    if isinstance(params, list):
        return None if not params and not required else "params"
    assert isinstance(params, dict)
    for key, value in params.items():
        if key not in allowed:
            return key
        if value is None and key not in required:
            continue  # null for an optional member is leaving it out
        if not allowed[key](value):
            return key
    for key in required:  # in the order of the params Struct's fields
        if key not in params:
            return key
    return None


def snapshot_params(params: Any) -> str | None:
    return _named(
        params,
        {
            "task": lambda v: isinstance(v, str),
            "timeout_ms": lambda v: _int_in(v, 0, 3_600_000),
            "max_age_ms": lambda v: _int_in(v, 0, 3_600_000),
            "since": lambda v: _int_in(v, 0, None),
            "usage": lambda v: isinstance(v, bool),
            "commands": lambda v: isinstance(v, bool),
            "ports": lambda v: isinstance(v, bool),
        },
        (),
    )


def subscribe_params(params: Any) -> str | None:
    return _named(
        params,
        {
            "since": lambda v: _int_in(v, 0, None),
            "commands": lambda v: isinstance(v, bool),
            "ports": lambda v: isinstance(v, bool),
        },
        (),
    )


def unsubscribe_params(params: Any) -> str | None:
    return _named(
        params,
        {"subscription": lambda v: isinstance(v, str) and 1 <= len(v) <= 128},
        ("subscription",),
    )


def _name(v: Any) -> bool:
    return isinstance(v, str) and 1 <= len(v) <= 4096


def _session_directory(v: str) -> bool:
    """docs/design.md §6: ``ses_`` first, no ``/``, ``\\``, ``..`` or NUL."""
    return v.startswith("ses_") and not any(bad in v for bad in ("/", "\\", "..", "\0"))


def reconcile_params(params: Any) -> str | None:
    bad = _named(
        params,
        {
            "from_session": _name,
            "this_session": _name,
            "context_id": lambda v: isinstance(v, str) and len(v) <= 4096,
        },
        ("from_session", "this_session", "context_id"),
    )
    if bad is None and not _session_directory(params["from_session"]):
        return "from_session"  # decoded, then refused by reconcile itself (-32602)
    return bad


def _spared(v: Any) -> bool:
    """One process of ``spare``: exactly ``pid`` (> 0) and ``started_at`` (an int)."""
    return (
        isinstance(v, dict)
        and set(v) == {"pid", "started_at"}
        and _int_in(v["pid"], 1, None)
        and _is_int(v["started_at"])
    )


def terminate_params(params: Any) -> str | None:
    return _named(
        params,
        {
            "session_id": _name,
            "signal": lambda v: v in ("TERM", "INT", "HUP", "KILL"),
            "grace_ms": lambda v: _int_in(v, 0, 3_600_000),
            "commands": lambda v: isinstance(v, bool),
            "spare": lambda v: isinstance(v, list) and len(v) <= 1024 and all(map(_spared, v)),
            "ended_only": lambda v: isinstance(v, bool),
        },
        ("session_id",),
    )


def ping_result(result: Any) -> None:
    assert result["pong"] is True and isinstance(result["version"], str), result


STATUS_KEYS = {
    "pid",
    "version",
    "home",
    "socket",
    "started_at",
    "uptime_s",
    "watcher",
    "discovery",
    "last_observed_at",
    "last_cost",
    "totals",
    "clients",
}


def status_result(result: Any) -> None:
    assert isinstance(result, dict) and STATUS_KEYS <= result.keys(), result
    assert result["watcher"] in ("native", "polling", "off"), result


def snapshot_result(result: Any) -> None:
    assert isinstance(result, dict), result
    assert result["discovery"] in ("ready", "scanning", "unavailable"), result
    assert isinstance(result["generation"], int) and isinstance(result["gaps"], list), result


def reconcile_result(result: Any) -> None:
    assert result is None or (isinstance(result, dict) and isinstance(result["lost"], list))


def terminate_result(result: Any) -> None:
    assert isinstance(result, dict) and isinstance(result["processes"], list), result
    assert isinstance(result["duration_ms"], int), result


def rescan_result(result: Any) -> None:
    assert result == {"scheduled": True}, result


def subscribe_result(result: Any) -> None:
    assert isinstance(result, dict) and isinstance(result["subscription"], str), result


def unsubscribe_result(result: Any) -> None:
    assert isinstance(result, dict) and isinstance(result["unsubscribed"], bool), result


def metrics_result(result: Any) -> None:
    assert isinstance(result, dict) and isinstance(result["text"], str), result
    assert result["text"].endswith("# EOF\n"), result


#: Every method docs/design.md §7 names; a test passes the subset the daemon serves.
METHODS: dict[str, MethodModel] = {
    "ping": MethodModel(no_params, ping_result),
    "status": MethodModel(no_params, status_result),
    "sessions.snapshot": MethodModel(snapshot_params, snapshot_result, frozenset({-32001})),
    "session.reconcile": MethodModel(
        reconcile_params, reconcile_result, frozenset({-32003, -32004})
    ),
    "reader.rescan": MethodModel(no_params, rescan_result),
    # -32002: too many subscriptions on one connection.
    "sessions.subscribe": MethodModel(subscribe_params, subscribe_result, frozenset({-32002})),
    "sessions.unsubscribe": MethodModel(unsubscribe_params, unsubscribe_result),
    "metrics": MethodModel(no_params, metrics_result),
    # -32007: the session is not active (a fuzzed session id never is).
    "session.terminate": MethodModel(terminate_params, terminate_result, frozenset({-32007})),
}


# --------------------------------------------------------------------------
# Prediction


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any) -> int:
    """Nesting depth of a decoded value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())


def _parse(text: bytes) -> tuple[bool, Any]:
    """(True, value) for a JSON text in UTF-8 with valid Unicode; (False, None) otherwise."""
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        return False, None
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        value = json.loads(decoded, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False, None
    finally:
        sys.setrecursionlimit(limit)
    for string in _strings(value):
        try:
            string.encode("utf-8")
        except UnicodeEncodeError:  # an unpaired surrogate escape: not Unicode text
            return False, None
    return True, value


def _request(obj: dict[str, Any], methods: Mapping[str, MethodModel]) -> Reply | None:
    notification = "id" not in obj
    id = obj.get("id")
    if not notification and not (
        id is None
        or isinstance(id, str)
        or (isinstance(id, (int, float)) and not isinstance(id, bool))
    ):
        return Reply(INVALID_REQUEST, None)
    if obj.get("jsonrpc", _MISSING) != "2.0" or not isinstance(obj.get("jsonrpc"), str):
        return Reply(INVALID_REQUEST, id)
    method = obj.get("method")
    if not isinstance(method, str):
        return Reply(INVALID_REQUEST, id)
    params = obj.get("params", _MISSING)
    if params is None:  # "params": null is no params
        params = _MISSING
    if params is not _MISSING and not isinstance(params, (dict, list)):
        return Reply(INVALID_REQUEST, id)
    if notification:
        return None
    model = methods.get(method)
    if model is None:
        return Reply(METHOD_NOT_FOUND, id)
    bad = model.params(params)
    if bad is not None:
        return Reply(INVALID_PARAMS, id, method, bad)
    return Reply(None, id, method)


def predict_line(text: bytes, methods: Mapping[str, MethodModel]) -> Single | Batch | Either | None:
    """What the daemon answers to one line (without its newline, at most 1 MiB)."""
    text = text.strip(JSON_WHITESPACE)
    if not text:
        return None
    ok, value = _parse(text)
    if not ok:
        return Single(Reply(PARSE_ERROR, None))
    depth = _depth(value)
    if depth >= DEPTH_REFUSED:
        return Single(Reply(PARSE_ERROR, None))
    parsed = _predict_value(value, methods)
    return Either(parsed) if depth > DEPTH_PARSED else parsed


def _predict_value(value: Any, methods: Mapping[str, MethodModel]) -> Single | Batch | None:
    if isinstance(value, list):
        if not value:
            return Single(Reply(INVALID_REQUEST, None))
        replies = []
        for item in value:
            reply = (
                _request(item, methods) if isinstance(item, dict) else Reply(INVALID_REQUEST, None)
            )
            if reply is not None:
                replies.append(reply)
        return Batch(replies) if replies else None
    if isinstance(value, dict):
        reply = _request(value, methods)
        return None if reply is None else Single(reply)
    return Single(Reply(INVALID_REQUEST, None))


def predict(payload: bytes, methods: Mapping[str, MethodModel]) -> Prediction:
    """What the daemon answers to ``payload`` sent on one connection, then half-closed."""
    prediction = Prediction()
    lines = payload.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the payload ended with a newline
    for line in lines:
        if len(line) > MiB:
            prediction.lines.append(Single(Reply(INVALID_REQUEST, None)))
            prediction.closes = True
            break
        prediction.lines.append(predict_line(line, methods))
    return prediction


# --------------------------------------------------------------------------
# Checking


def _same_id(got: Any, want: Any) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return False
    return bool(got == want) and type(got) is not bool


def _check_reply(got: Any, want: Reply, methods: Mapping[str, MethodModel]) -> None:
    assert isinstance(got, dict), got
    assert got.get("jsonrpc") == "2.0", got
    assert "id" in got and _same_id(got["id"], want.id), (got, want)
    if want.code is None:
        assert want.method is not None
        model = methods[want.method]
        if "error" in got:
            assert "result" not in got, got
            assert got["error"]["code"] in model.errors, (got, want)
            return
        assert set(got) == {"jsonrpc", "id", "result"}, got
        model.result(got["result"])
        return
    assert set(got) == {"jsonrpc", "id", "error"}, got
    error = got["error"]
    assert error["code"] == want.code, (got, want)
    assert isinstance(error["message"], str) and error["message"], got
    if want.code == INVALID_PARAMS:
        data = error["data"]
        assert isinstance(data["reason"], str) and data["reason"], got
        if want.param != "params":  # a long name is cut to 100 characters
            assert data["param"] == (want.param or "")[:100], (got, want)


def _check_line(got: Any, want: Single | Batch, methods: Mapping[str, MethodModel]) -> None:
    if isinstance(want, Single):
        _check_reply(got, want.reply, methods)
        return
    assert isinstance(got, list) and len(got) == len(want.replies), (len(got), len(want.replies))
    for item, expected in zip(got, want.replies, strict=True):
        _check_reply(item, expected, methods)


def _fits(got: Any, want: Single | Batch | Either, methods: Mapping[str, MethodModel]) -> bool:
    try:
        if isinstance(want, Either):
            if isinstance(got, dict) and got.get("error", {}).get("code") == PARSE_ERROR:
                _check_reply(got, Reply(PARSE_ERROR, None), methods)
            elif want.parsed is None:
                return False
            else:
                _check_line(got, want.parsed, methods)
        else:
            _check_line(got, want, methods)
    except (AssertionError, KeyError, TypeError):
        return False
    return True


def _match(
    wanted: list[Single | Batch | Either], got: list[Any], methods: Mapping[str, MethodModel]
) -> bool:
    """Whether the replies fit the predictions in order; an ``Either(None)`` may be absent."""
    if not wanted:
        return not got
    first, rest = wanted[0], wanted[1:]
    if got and _fits(got[0], first, methods) and _match(rest, got[1:], methods):
        return True
    return isinstance(first, Either) and first.parsed is None and _match(rest, got, methods)


def check(payload: bytes, received: bytes, methods: Mapping[str, MethodModel]) -> tuple[int, int]:
    """Assert that ``received`` is exactly what the protocol promises for ``payload``.

    Returns:
        (messages sent, replies received), for the figures.
    """
    prediction = predict(payload, methods)
    assert received == b"" or received.endswith(b"\n"), received[-200:]
    got = [json.loads(line) for line in received.split(b"\n")[:-1]] if received else []
    # Server notifications (subscriptions) may interleave with replies (docs/design.md §7).
    got = [line for line in got if not (isinstance(line, dict) and "method" in line)]
    wanted = [line for line in prediction.lines if line is not None]
    if not _match(wanted, got, methods):
        # Say where: the first reply that does not fit, checked strictly.
        assert len(got) == len(wanted), (len(got), len(wanted), received[:500])
        for reply, want in zip(got, wanted, strict=True):
            if isinstance(want, Either) and want.parsed is not None:
                _check_line(reply, want.parsed, methods)
            elif not isinstance(want, Either):
                _check_line(reply, want, methods)
        raise AssertionError(f"replies do not fit the prediction: {got!r:.500} {wanted!r:.500}")
    return len(prediction.lines), len(got)
