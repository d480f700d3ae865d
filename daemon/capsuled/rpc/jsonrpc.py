"""The JSON-RPC 2.0 envelope and dispatch, free of I/O (docs/design.md §7).

:meth:`Dispatcher.answer` takes one received line and returns the reply to
send back (its parts, without the newline), or ``None`` when nothing is
owed: a notification, a batch of notifications, a blank line. Each request
is decoded once: its envelope, then its params, from the envelope's
``msgspec.Raw``, with the method's own typed decoder. The rules, with the
codes of https://www.jsonrpc.org/specification:

* not JSON (including invalid UTF-8, an unpaired surrogate escape such as
  ``"\\ud800"``, or nesting deeper than the decoder allows, about 900
  levels): -32700 with ``id: null``. Only JSON's own whitespace (space, tab,
  CR, LF) may surround a message;
* JSON that is not a request object, ``jsonrpc`` other than ``"2.0"``, a
  missing or non-string ``method``, an ``id`` that is not a string, number or
  null, ``params`` that are not an object, an array or null: -32600 (with the
  request's id when it could be read, else null);
* ``"params": null`` is the same as no params, and ``null`` for an optional
  member the same as leaving it out (clients of several languages send them);
* an unknown method: -32601; params that do not fit the method: -32602 whose
  message and ``data`` name the parameter and the reason;
* a handler raising :class:`~capsuled.errors.RpcError`: that error; any other
  exception: -32603, logged with its traceback;
* a notification (no ``id`` member) is executed and never answered, even on
  error; ``"id": null`` is a request and is answered;
* a batch is answered by an array of the non-notification replies in request
  order; an empty batch gets one -32600; a batch of notifications gets none.
  Once the replies of a batch pass ``BATCH_REPLY_MAX_BYTES``, its remaining
  requests are not run and are answered -32002 (a 1 MiB batch of snapshot
  requests would otherwise build a reply of gigabytes);

The JSON-RPC envelope is one of the two pieces of plumbing the project writes
itself instead of taking a library (docs/design.md §7 says why).
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import structlog
from msgspec import UNSET, Raw, Struct

from capsule_client.wire import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    JSONRPC_VERSION,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    Envelope,
    ErrorCode,
    ErrorObject,
    ErrorResponse,
    SuccessResponse,
)
from capsuled.errors import RpcError, ShuttingDown

from .params import InvalidParams, ParamsDecoder

__all__ = [
    "BATCH_REPLY_MAX_BYTES",
    "SPLICE_MIN_BYTES",
    "Dispatcher",
    "Encoded",
    "Handler",
    "Method",
    "ReplyParts",
    "encode_error",
]

log = structlog.get_logger("capsuled.rpc")

#: A method's handler: takes the decoded params Struct, returns the result, or
#: an awaitable of it (a coroutine function); the dispatcher awaits what needs it.
Handler = Callable[[Any], Any]

_encoder: Final = msgspec.json.Encoder()
_envelope: Final = msgspec.json.Decoder(Envelope)
_batch: Final = msgspec.json.Decoder(list[Raw])
_str: Final = msgspec.json.Decoder(str)
#: RFC 8259 §2: the only whitespace allowed around a JSON text.
_JSON_WHITESPACE: Final = b" \t\r\n"
#: First byte of ``params`` that may be a request's: an object, an array, ``null``.
_PARAMS_START: Final = (b"{", b"[", b"n")
#: First byte of a JSON number (RFC 8259 §6).
_NUMBER_START: Final = frozenset(b"-0123456789")
#: msgspec decodes nested arrays and objects recursively; past Python's
#: recursion limit it raises RecursionError, which is the input's fault.
_TOO_DEEP: Final = "parse error: JSON nested too deeply"
_json: Final = msgspec.json.Decoder(Raw)  # checks that a text is JSON, keeps nothing
#: A ``\uD800``-``\uDBFF`` escape not followed by a low-surrogate escape, outside
#: an escaped backslash: msgspec reads on for the pair and reports "Input data was
#: truncated" when the text ends first.
_LONE_HIGH_SURROGATE: Final = re.compile(
    rb"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2})(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)

#: An encoded result at least this large is sent from its own buffer (see
#: :meth:`Dispatcher.answer`); below it, one copy costs less than a part, and the
#: connection joins a smaller part with its neighbours before it sends them.
SPLICE_MIN_BYTES: Final = 64 * 1024
_PLACEHOLDER: Final = Raw(b"0")
_PLACEHOLDER_TAIL: Final = b"0}"

#: Replies a batch may gather before its remaining requests are refused (-32002).
#: The reply that passes it is still sent whole, so a batch always gets at least
#: one answer, however large: one snapshot of 100,000 processes is 16 MB.
BATCH_REPLY_MAX_BYTES: Final = 16 * 1024 * 1024
#: What an error reply is counted as against the cap (its message is bounded).
_ERROR_REPLY_BYTES: Final = 512
_BATCH_FULL: Final = (
    f"overloaded: the batch's replies passed {BATCH_REPLY_MAX_BYTES} bytes; "
    "this request was not run: send fewer requests per batch"
)

#: One reply line in parts (without its newline): send them in order.
ReplyParts = tuple[bytes | memoryview, ...]


@dataclass(frozen=True, slots=True)
class Encoded:
    """A handler's result already encoded as JSON, in parts that are never joined.

    Discovery keeps a snapshot's long lists encoded apart from the rest, so
    that a new observation re-encodes only what changed; handing the parts
    over as they are spares joining megabytes for every new answer. A batch
    reply (one array) joins them.
    """

    parts: ReplyParts

    @property
    def size(self) -> int:
        """The JSON text's length, bytes."""
        return sum(len(part) for part in self.parts)

    def joined(self) -> Raw:
        """The parts as one ``Raw``."""
        return Raw(b"".join(self.parts))


#: Results a handler hands over already encoded (a tuple: ``isinstance`` with
#: ``Raw | Encoded`` would build the union on every request).
_ENCODED: Final = (Raw, Encoded)


@dataclass(frozen=True, slots=True)
class Method:
    """A method the daemon serves: its params type and its handler.

    The handler may be a plain function or a coroutine function: its result
    is awaited when it is awaitable.
    """

    params: type[Struct]
    handler: Handler


class _Invalid(Exception):
    """A request that cannot be dispatched; carries the error to answer."""

    def __init__(self, code: int, message: str, data: Any = UNSET) -> None:
        super().__init__(message)
        self.error = ErrorObject(code=code, message=message, data=data)


def encode_error(code: int, message: str, id: Raw | None = None, data: Any = UNSET) -> bytes:
    """One error response, encoded (no newline)."""
    error = ErrorObject(code=code, message=message, data=data)
    return _encoder.encode(ErrorResponse(jsonrpc=JSONRPC_VERSION, id=id, error=error))


class Dispatcher:
    """Decodes requests, runs their handlers and encodes the replies.

    Args:
        methods: method name → :class:`Method`.
        on_request: called once per dispatched request or notification with
            ``(method, outcome, duration_s)``, outcome ``None`` or the error
            code; used for the ``status`` totals and the latency histogram.
        stopping: whether the daemon is shutting down (the lifecycle's one
            shutdown state): requests are then answered -32005.
    """

    def __init__(
        self,
        methods: Mapping[str, Method],
        on_request: Callable[[str, int | None, float], None] | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self._methods = dict(methods)
        self._params = {name: ParamsDecoder(m.params) for name, m in methods.items()}
        self._on_request = on_request
        # Bound once: through the module's lazy proxy every call resolves the
        # logger again. Logging is configured before the daemon makes its
        # dispatcher; the per-request record is debug only.
        self._log = log.bind()
        self._log_requests = self._log.is_enabled_for(logging.DEBUG)
        self._stopping = stopping

    async def answer(self, line: bytes) -> ReplyParts | None:
        """The reply to one received line (without its ``\\n``), in parts; ``None``: send nothing.

        Send the parts one after the other, then the newline. A result handed
        over already encoded (a ``Raw`` or an :class:`Encoded`) of at least
        ``SPLICE_MIN_BYTES`` is not copied into the reply: the parts are the
        envelope's head, the result's own buffers, and the closing brace (a
        snapshot of 100,000 processes is 16 MB, kept encoded by discovery).
        """
        parsed = self._parse(line)
        if isinstance(parsed, Envelope):
            return self._parts(await self._handle_one(parsed))
        if isinstance(parsed, _Batch):
            reply = await self._handle_batch(parsed.text)
            return None if reply is None else (reply,)
        return None if parsed is None else (parsed,)

    def _parts(self, reply: SuccessResponse | ErrorResponse | None) -> ReplyParts | None:
        if reply is None:
            return None
        result = reply.result if isinstance(reply, SuccessResponse) else None
        if isinstance(result, Encoded):
            if result.size >= SPLICE_MIN_BYTES:
                return self._spliced(reply, result.parts)
            reply = msgspec.structs.replace(reply, result=result.joined())
        elif isinstance(result, Raw) and len(result) >= SPLICE_MIN_BYTES:
            return self._spliced(reply, (memoryview(result),))
        return (_encoder.encode(reply),)

    @staticmethod
    def _spliced(reply: SuccessResponse | ErrorResponse, parts: ReplyParts) -> ReplyParts:
        """The envelope's head, the result's own parts, the closing brace."""
        head = _encoder.encode(msgspec.structs.replace(reply, result=_PLACEHOLDER))
        # ``result`` is the envelope's last member: the head ends with its placeholder.
        return (memoryview(head)[: -len(_PLACEHOLDER_TAIL)], *parts, b"}")

    @staticmethod
    def _parse(line: bytes) -> Envelope | _Batch | bytes | None:
        """A single request's envelope, a batch's text, an encoded error, or ``None`` (blank)."""
        text = line.strip(_JSON_WHITESPACE)
        if not text:
            return None  # a blank line: nothing was asked (convenient with socat)
        try:
            # Raw members are not checked for UTF-8 until decoded; JSON text must be UTF-8.
            text.decode("utf-8")
        except UnicodeDecodeError as exc:
            return encode_error(PARSE_ERROR, f"parse error: invalid UTF-8 at byte {exc.start}")
        if text[:1] == b"[":
            return _Batch(text)
        try:
            return _envelope.decode(text)
        except msgspec.ValidationError:
            # msgspec stops at the first token of the wrong type; the rest of the
            # line must still be JSON for this to be a request at all.
            return _not_a_request(text)
        except msgspec.DecodeError as exc:
            return _parse_error(text, exc)
        except RecursionError:
            return encode_error(PARSE_ERROR, _TOO_DEEP)

    async def _handle_batch(self, text: bytes) -> bytes | None:
        try:
            items = _batch.decode(text)
        except msgspec.DecodeError as exc:
            return _parse_error(text, exc)
        except RecursionError:
            return encode_error(PARSE_ERROR, _TOO_DEEP)
        if not items:
            return encode_error(INVALID_REQUEST, "invalid request: empty batch")
        replies: list[SuccessResponse | ErrorResponse] = []
        reply_bytes = 0
        for item in items:
            try:
                envelope = _envelope.decode(item)
            except (msgspec.DecodeError, RecursionError):
                replies.append(_error(None, INVALID_REQUEST, "invalid request: not an object"))
                continue
            if reply_bytes > BATCH_REPLY_MAX_BYTES and envelope.id is not UNSET:
                id = envelope.id if _valid_id(envelope.id) else None
                replies.append(_error(id, ErrorCode.OVERLOADED, _BATCH_FULL))
                continue
            reply = await self._handle_one(envelope)
            if reply is not None:
                if isinstance(reply, SuccessResponse) and isinstance(reply.result, Encoded):
                    reply = msgspec.structs.replace(reply, result=reply.result.joined())
                replies.append(reply)
                result = reply.result if isinstance(reply, SuccessResponse) else None
                reply_bytes += len(result) if isinstance(result, Raw) else _ERROR_REPLY_BYTES
        return _encoder.encode(replies) if replies else None

    async def _handle_one(self, envelope: Envelope) -> SuccessResponse | ErrorResponse | None:
        id_ok = envelope.id is UNSET or _valid_id(envelope.id)
        id = envelope.id if id_ok and envelope.id is not UNSET else None
        try:
            if not id_ok:
                raise _Invalid(
                    INVALID_REQUEST, "invalid request: id must be a string, number or null"
                )
            name = self._validate(envelope)
        except _Invalid as invalid:
            return _with_id(id, invalid.error)
        is_notification = envelope.id is UNSET
        name = name if name in self._methods else name[:200]  # bound what reaches the logs
        started = time.perf_counter()
        outcome: int | None = None
        try:
            method = self._methods.get(name)
            if method is None:
                raise _Invalid(METHOD_NOT_FOUND, f"method not found: {name[:200]!r}")
            if self._stopping():
                raise ShuttingDown("the daemon is shutting down")
            try:
                params = self._params[name].decode(envelope.params)
            except InvalidParams as exc:
                raise _Invalid(INVALID_PARAMS, str(exc), exc.data) from None
            result = method.handler(params)
            if inspect.isawaitable(result):
                result = await result
            if is_notification:
                return None
            try:
                # Encode here so that an unencodable result is this request's error;
                # a handler may hand over its result already encoded (a Raw).
                raw = result if isinstance(result, _ENCODED) else Raw(_encoder.encode(result))
                return SuccessResponse(jsonrpc=JSONRPC_VERSION, id=id, result=raw)
            except (TypeError, msgspec.EncodeError) as exc:
                raise RuntimeError(f"result of {name} cannot be encoded") from exc
        except _Invalid as invalid:
            outcome = invalid.error.code
            return None if is_notification else _with_id(id, invalid.error)
        except RpcError as exc:
            outcome = exc.code
            self._log.info("request failed", method=name, code=exc.code, error=exc.message)
            data = UNSET if exc.data is None else exc.data
            error = ErrorObject(code=exc.code, message=exc.message, data=data)
            return None if is_notification else _with_id(id, error)
        except Exception as exc:
            outcome = INTERNAL_ERROR
            self._log.error("method raised", method=name, exc_info=True)
            message = f"internal error in {name}: {type(exc).__name__}: {exc}"
            return None if is_notification else _error(id, INTERNAL_ERROR, message)
        finally:
            self._done(name, outcome, started, is_notification)

    def _done(self, name: str, outcome: int | None, started: float, notification: bool) -> None:
        """Count a dispatched request (``outcome``: ``None`` or its error code) and log it."""
        duration_s = time.perf_counter() - started
        if self._log_requests:
            self._log.debug(
                "request",
                method=name,
                duration_ms=round(duration_s * 1000, 3),
                outcome="ok" if outcome is None else outcome,
                notification=notification,
            )
        if self._on_request is not None:
            self._on_request(name, outcome, duration_s)

    def _validate(self, envelope: Envelope) -> str:
        """The method name of a well-formed request; raises :class:`_Invalid` otherwise."""
        if envelope.jsonrpc is UNSET or _decode_str(envelope.jsonrpc) != JSONRPC_VERSION:
            raise _Invalid(INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"')
        name = None if envelope.method is UNSET else _decode_str(envelope.method)
        if name is None:
            raise _Invalid(INVALID_REQUEST, 'invalid request: "method" must be a string')
        if (
            envelope.params is not UNSET
            and bytes(envelope.params).lstrip()[:1] not in _PARAMS_START
        ):
            raise _Invalid(
                INVALID_REQUEST, 'invalid request: "params" must be an object, an array or null'
            )
        return name


@dataclass(frozen=True, slots=True)
class _Batch:
    """A received line that is a batch (its text, stripped)."""

    text: bytes


def _parse_error(text: bytes, exc: msgspec.DecodeError) -> bytes:
    """-32700 for ``text``, which msgspec could not decode; an unpaired surrogate is named."""
    lone = _LONE_HIGH_SURROGATE.search(text)
    if lone is not None:
        escape = lone[1].decode("ascii")
        return encode_error(
            PARSE_ERROR,
            f"parse error: unpaired UTF-16 surrogate escape {escape} at byte {lone.start(1)}"
            " (a JSON string must be valid Unicode)",
        )
    return encode_error(PARSE_ERROR, f"parse error: {exc}")


def _not_a_request(text: bytes) -> bytes:
    """-32600 for JSON that is not a request object; -32700 if it is not JSON at all."""
    try:
        _json.decode(text)
    except msgspec.DecodeError as exc:
        return _parse_error(text, exc)
    except RecursionError:
        return encode_error(PARSE_ERROR, _TOO_DEEP)
    return encode_error(INVALID_REQUEST, "invalid request: not a JSON-RPC request object")


def _decode_str(raw: Raw) -> str | None:
    try:
        return _str.decode(raw)
    except msgspec.DecodeError:
        return None


def _valid_id(raw: Raw) -> bool:
    """A JSON-RPC id is a string, a number or null.

    Decided by the JSON type alone, from the first byte of the already
    validated text: a number too large for a float (``1e400``) is still a
    number, and is echoed back exactly as it was sent.
    """
    first = bytes(raw).lstrip(_JSON_WHITESPACE)[:1]
    return first == b'"' or first == b"n" or (first != b"" and first[0] in _NUMBER_START)


def _error(id: Raw | None, code: int, message: str) -> ErrorResponse:
    return ErrorResponse(
        jsonrpc=JSONRPC_VERSION, id=id, error=ErrorObject(code=code, message=message)
    )


def _with_id(id: Raw | None, error: ErrorObject) -> ErrorResponse:
    return ErrorResponse(jsonrpc=JSONRPC_VERSION, id=id, error=error)
