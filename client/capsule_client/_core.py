"""Everything both clients share that needs no I/O (after httpx's ``_client.py``).

Building requests and ids, reading replies, mapping error codes to
exceptions and decoding typed results live here once; ``Client`` and
``AsyncClient`` only move bytes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

import msgspec
from msgspec import UNSET, Raw

from ._exceptions import ClientClosed, ProtocolError, SubscriptionDropped, error_from_wire
from .paths import default_socket
from .protocol import (
    JSONRPC_VERSION,
    SESSIONS_CHANGED,
    SESSIONS_DROPPED,
    ActiveSessionsSnapshot,
    LostReport,
    MetricsResult,
    PingResult,
    Request,
    RescanResult,
    Response,
    SessionsChanged,
    SessionsDropped,
    StatusResult,
    SubscribeResult,
    TerminateReport,
    TerminateSignal,
    UnsubscribeResult,
)
from .trace import DEFAULT_LOCK_TIMEOUT_S

__all__ = ["DEFAULT_TIMEOUT_S", "Call", "ClientCore"]

T = TypeVar("T")

#: Seconds a client waits for a reply unless told otherwise.
DEFAULT_TIMEOUT_S: Final = 5.0
#: Extra seconds a client waits beyond a server-side ``timeout_ms``.
_SERVER_WAIT_MARGIN_S: Final = 2.0
#: Seconds a reconcile may scan once it holds the trace's lock (a 1 GB trace takes ~2-5 s).
_RECONCILE_SCAN_ALLOWANCE_S: Final = 10.0
#: Seconds a terminate may take beyond its grace: the fresh observation
#: before it, the wait after ``SIGKILL``.
_TERMINATE_ALLOWANCE_S: Final = 10.0

#: Notifications kept for held subscriptions while no one iterates them. The
#: daemon sends at most 50 a second per subscription and coalesces the rest,
#: so this bounds only a client that holds a subscription and never reads it;
#: past it, the subscription ends as if the daemon had dropped it.
MAX_QUEUED_NOTIFICATIONS: Final = 4096

#: The longest line a client accepts from the daemon, bytes. The largest
#: replies are a reconcile of hundreds of thousands of lost works (about
#: 90 MB for 300,000) and a snapshot batch (its replies stop after 16 MiB);
#: a longer line, or that many bytes without a line end, is not a reply.
MAX_REPLY_BYTES: Final = 1 << 30

_encoder: Final = msgspec.json.Encoder()
_response: Final = msgspec.json.Decoder(Response)
_changed: Final = msgspec.json.Decoder(SessionsChanged)
_dropped: Final = msgspec.json.Decoder(SessionsDropped)


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One method call: what to send and how to read the result.

    Attributes:
        method: the JSON-RPC method.
        params: named params, or ``None`` for none.
        result_type: the type the result decodes to.
        min_timeout_s: the least the client must wait (a long poll asks for
            more than the client's default).
    """

    method: str
    params: dict[str, Any] | None
    result_type: Any
    min_timeout_s: float = 0.0
    decoder: msgspec.json.Decoder[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "decoder", _decoder_for(self.result_type))


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder_for(result_type: Any) -> msgspec.json.Decoder[Any]:
    decoder = _decoders.get(result_type)
    if decoder is None:
        decoder = _decoders[result_type] = msgspec.json.Decoder(result_type)
    return decoder


def ping() -> Call[PingResult]:
    return Call("ping", None, PingResult)


def status() -> Call[StatusResult]:
    return Call("status", None, StatusResult)


def snapshot(
    task: str | None,
    timeout_ms: int | None,
    max_age_ms: int | None,
    since: int | None,
    usage: bool = False,
    fresh: bool = False,
    commands: bool = False,
) -> Call[ActiveSessionsSnapshot]:
    if fresh:
        if max_age_ms not in (None, 0):
            raise ValueError("fresh=True asks for max_age_ms=0; do not pass another max_age_ms")
        max_age_ms = 0
    params: dict[str, Any] = {}
    for name, value in (
        ("task", task),
        ("timeout_ms", timeout_ms),
        ("max_age_ms", max_age_ms),
        ("since", since),
        ("usage", usage or None),
        ("commands", commands or None),
    ):
        if value is not None:
            params[name] = value
    wait_ms = 2000 if timeout_ms is None else timeout_ms
    return Call(
        "sessions.snapshot",
        params,
        ActiveSessionsSnapshot,
        min_timeout_s=wait_ms / 1000 + _SERVER_WAIT_MARGIN_S,
    )


def reconcile(from_session: str, this_session: str, context_id: str) -> Call[LostReport | None]:
    params = {"from_session": from_session, "this_session": this_session, "context_id": context_id}
    # The daemon may wait this long for the trace's lock, then scan: don't give up first.
    wait_s = DEFAULT_LOCK_TIMEOUT_S + _RECONCILE_SCAN_ALLOWANCE_S
    return Call("session.reconcile", params, LostReport | None, min_timeout_s=wait_s)


def metrics() -> Call[MetricsResult]:
    return Call("metrics", None, MetricsResult)


def rescan() -> Call[RescanResult]:
    return Call("reader.rescan", None, RescanResult)


def terminate(
    session_id: str, signal: TerminateSignal, grace_s: float, commands: bool = False
) -> Call[TerminateReport]:
    """``session.terminate``: the client waits out the grace, the kill and an observation."""
    if not 0 <= grace_s <= 3600:
        raise ValueError(f"grace_s must be within [0, 3600] seconds, not {grace_s!r}")
    grace_ms = round(grace_s * 1000)
    params: dict[str, Any] = {"session_id": session_id, "signal": signal, "grace_ms": grace_ms}
    if commands:
        params["commands"] = True
    wait_s = grace_ms / 1000 + _TERMINATE_ALLOWANCE_S
    return Call("session.terminate", params, TerminateReport, min_timeout_s=wait_s)


def subscribe(since: int | None, commands: bool = False) -> Call[SubscribeResult]:
    params: dict[str, Any] = {}
    if since is not None:
        params["since"] = since
    if commands:
        params["commands"] = True
    return Call("sessions.subscribe", params or None, SubscribeResult)


def unsubscribe(subscription: str) -> Call[UnsubscribeResult]:
    return Call("sessions.unsubscribe", {"subscription": subscription}, UnsubscribeResult)


class ClientCore:
    """Request ids, encoding, reply parsing and error mapping for one connection.

    Args:
        socket_path: the daemon's socket; default per docs/design.md §2.
        timeout_s: seconds to wait for each reply.
        max_reply_bytes: the longest line accepted from the daemon.
    """

    def __init__(
        self,
        socket_path: str | Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ):
        self.socket_path = Path(socket_path) if socket_path is not None else default_socket()
        self.timeout_s = timeout_s
        self.max_reply_bytes = max_reply_bytes
        self.closed = False
        self._last_id = 0
        self._subscriptions: set[str] = set()
        self._notifications: deque[SessionsChanged | SessionsDropped] = deque()

    def check_open(self) -> None:
        """Raises :class:`ClientClosed` once the client has been closed."""
        if self.closed:
            raise ClientClosed("this client is closed; make a new one")

    def too_long(self) -> ProtocolError:
        """The error for a line from the daemon longer than :attr:`max_reply_bytes`."""
        return ProtocolError(
            f"{self.socket_path} sent more than {self.max_reply_bytes} bytes without a line end: "
            "not a reply (the connection is closed)"
        )

    def timeout_for(self, call: Call[Any]) -> float:
        """Seconds to wait for the reply to ``call``."""
        return max(self.timeout_s, call.min_timeout_s)

    def encode(self, call: Call[Any]) -> tuple[int, bytes]:
        """A fresh request id and the request line (with its newline)."""
        self._last_id += 1
        params = UNSET if call.params is None else call.params
        request = Request(
            jsonrpc=JSONRPC_VERSION, method=call.method, id=self._last_id, params=params
        )
        return self._last_id, _encoder.encode(request) + b"\n"

    def read_reply(self, request_id: int, line: bytes) -> Raw | None:
        """The raw result of the reply ``line``; ``None`` if it is a notification.

        Raises:
            RemoteError: (a subclass per code) the daemon answered an error.
            ProtocolError: the line is not a JSON-RPC reply to this request.
        """
        try:
            reply = _response.decode(line)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"the daemon's reply is not JSON-RPC: {exc}") from exc
        if reply.method is not UNSET:
            self._keep(reply)  # a notification (subscriptions); not this request's reply
            return None
        if reply.error is not UNSET:
            error = reply.error
            data = None if error.data is UNSET else error.data
            raise error_from_wire(error.code, error.message, data)
        if reply.result is UNSET:
            raise ProtocolError("the daemon's reply has neither result nor error")
        if reply.id != request_id:
            raise ProtocolError(f"reply for another request (id {reply.id!r})")
        return reply.result

    @staticmethod
    def decode(call: Call[T], raw: Raw) -> T:
        """The typed result of ``call`` from its raw result."""
        try:
            result: T = call.decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"unexpected result for {call.method}: {exc}") from exc
        return result

    # ------------------------------------------------------------------
    # Subscriptions: notifications are read by the same connection as
    # replies; those that arrive while a reply is awaited are kept here.

    def subscribed(self, subscription: str) -> None:
        """Start keeping the notifications of ``subscription``."""
        self._subscriptions.add(subscription)

    def unsubscribed(self, subscription: str) -> None:
        """Stop keeping them and forget those kept."""
        self._subscriptions.discard(subscription)
        kept = [event for event in self._notifications if event.subscription != subscription]
        self._notifications.clear()
        self._notifications.extend(kept)

    def read_notification(self, line: bytes) -> None:
        """Take a line read while no reply was awaited: it must be a notification.

        Raises:
            ProtocolError: the line is not JSON-RPC, or a reply nobody asked for.
        """
        try:
            message = _response.decode(line)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"the daemon sent something that is not JSON-RPC: {exc}") from exc
        if message.method is UNSET:
            raise ProtocolError("the daemon sent a reply to no request")
        self._keep(message)

    def next_change(self, subscription: str) -> SessionsChanged | None:
        """The oldest kept ``sessions.changed`` of ``subscription``, or None.

        Raises:
            SubscriptionDropped: the daemon dropped it (the subscription is forgotten).
        """
        for event in self._notifications:
            if event.subscription != subscription:
                continue
            self._notifications.remove(event)
            if isinstance(event, SessionsDropped):
                self.unsubscribed(subscription)
                raise SubscriptionDropped(subscription, event.reason)
            return event
        return None

    def _keep(self, message: Response) -> None:
        if message.params is UNSET:
            return
        try:
            if message.method == SESSIONS_CHANGED:
                event: SessionsChanged | SessionsDropped = _changed.decode(message.params)
            elif message.method == SESSIONS_DROPPED:
                event = _dropped.decode(message.params)
            else:
                return  # a notification this client does not know: ignored
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"unexpected {message.method} notification: {exc}") from exc
        if event.subscription not in self._subscriptions:
            return
        if len(self._notifications) >= MAX_QUEUED_NOTIFICATIONS:
            # Differences cannot be skipped: end the subscription instead.
            self.unsubscribed(event.subscription)
            self._subscriptions.add(event.subscription)
            event = SessionsDropped(
                event.subscription,
                f"the client kept {MAX_QUEUED_NOTIFICATIONS} notifications unread",
            )
        self._notifications.append(event)
