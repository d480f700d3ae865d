"""Everything both clients share that needs no I/O (after httpx's ``_client.py``).

Request ids and encoding, reading replies, mapping error codes to exceptions,
decoding typed results and keeping subscriptions' notifications live here once;
each method's call is built in :mod:`.calls`; ``Client`` and ``AsyncClient``
only move bytes.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec
from msgspec import UNSET, Raw

from .calls import Call, decoder_for, subscribe
from .errors import ClientClosed, ProtocolError, SubscriptionDropped, error_from_wire
from .kit.paths import default_socket
from .wire.constants import (
    DEFAULT_TIMEOUT_S,
    JSONRPC_VERSION,
    SESSIONS_CHANGED,
    SESSIONS_DROPPED,
)
from .wire.envelope import Request, Response
from .wire.results import (
    SessionsChanged,
    SessionsDropped,
    SubscribeResult,
)

__all__ = [
    "MAX_QUEUED_NOTIFICATIONS",
    "MAX_REPLY_BYTES",
    "BaseClient",
    "ClientCore",
    "SubscriptionBase",
]

T = TypeVar("T")

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


class BaseClient:
    """What both clients hold and do without I/O (after httpx's ``BaseClient``).

    Args:
        socket_path: the daemon's socket; default per docs/design.md §2
            (``$CAPSULED_SOCKET``, ``$XDG_RUNTIME_DIR/capsuled.sock``, ...).
        timeout_s: seconds to wait for each reply (long polls wait longer).
        max_reply_bytes: the longest line accepted from the daemon (default
            1 GiB: a reconcile of 300,000 lost works is about 90 MB).

    Raises (from every method of either client):
        DaemonNotRunning: nothing accepts connections on the socket.
        RequestTimeout: no reply in time (the connection is closed).
        ConnectionLost: the daemon closed the connection before answering.
        ProtocolError: what came back is not a JSON-RPC reply, or is longer
            than ``max_reply_bytes`` (the connection is closed).
        RemoteError: the daemon answered an error (a subclass per code).
        ClientClosed: the client was used after it was closed.
    """

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        self._core = ClientCore(socket_path, timeout_s, max_reply_bytes)
        self._unconnected()

    def _unconnected(self) -> None:
        """Set the client's connection state to "no connection yet" (each client's own)."""

    @property
    def socket_path(self) -> Path:
        """The socket this client talks to."""
        return self._core.socket_path


class SubscriptionBase:
    """What both subscriptions share: the ask, the id, and the core's book-keeping.

    Raises (from iterating either subscription):
        SubscriptionDropped: the daemon dropped the subscription (it fell
            behind); subscribe again for a fresh full answer.
        ConnectionLost: the daemon went away.
    """

    def __init__(self, since: int | None, commands: bool, *, ports: bool = False) -> None:
        self._since = since
        self._commands = commands
        self._ports = ports
        self.id: str | None = None

    def _subscribe(self) -> Call[SubscribeResult]:
        return subscribe(self._since, self._commands, ports=self._ports)

    def _subscribed(self, core: ClientCore, result: SubscribeResult) -> str:
        self.id = result.subscription
        core.subscribed(self.id)
        return self.id

    def _leave(self, core: ClientCore) -> str | None:
        """Forget the subscription; its id, to unsubscribe with (None: not subscribed)."""
        subscription, self.id = self.id, None
        if subscription is not None:
            core.unsubscribed(subscription)
        return subscription


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
                event: SessionsChanged | SessionsDropped = decoder_for(SessionsChanged).decode(
                    message.params
                )
            elif message.method == SESSIONS_DROPPED:
                event = decoder_for(SessionsDropped).decode(message.params)
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
