"""Everything both clients share that needs no I/O (after httpx's ``_client.py``).

Building requests and ids, reading replies, mapping error codes to
exceptions and decoding typed results live here once; ``Client`` and
``AsyncClient`` only move bytes.
"""

from __future__ import annotations

import functools
import inspect
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Concatenate, Final, Generic, NamedTuple, ParamSpec, Protocol, TypeVar

import msgspec
from msgspec import UNSET, Raw

from .errors import ClientClosed, ProtocolError, SubscriptionDropped, error_from_wire
from .kit.paths import default_socket
from .wire.constants import (
    DEFAULT_GRACE_MS,
    DEFAULT_SNAPSHOT_TIMEOUT_MS,
    DEFAULT_TIMEOUT_S,
    JSONRPC_VERSION,
    MAX_PARAM_MS,
    SESSIONS_CHANGED,
    SESSIONS_DROPPED,
    TRACE_LOCK_TIMEOUT_S,
)
from .wire.envelope import Request, Response
from .wire.params import TerminateSignal
from .wire.results import (
    ActiveSessionsSnapshot,
    LostReport,
    MetricsResult,
    PingResult,
    RescanResult,
    SessionsChanged,
    SessionsDropped,
    StatusResult,
    SubscribeResult,
    TerminateReport,
    UnsubscribeResult,
)

__all__ = [
    "MAX_QUEUED_NOTIFICATIONS",
    "MAX_REPLY_BYTES",
    "BaseClient",
    "Call",
    "ClientCore",
    "SubscriptionBase",
    "awaiting",
    "blocking",
]

T = TypeVar("T")
P = ParamSpec("P")
M = TypeVar("M", bound=Callable[..., Any])

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


class Call(NamedTuple, Generic[T]):
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

    @property
    def decoder(self) -> msgspec.json.Decoder[Any]:
        """The typed decoder of the result (one per result type, made on first use)."""
        return _decoder_for(self.result_type)


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder_for(result_type: Any) -> msgspec.json.Decoder[Any]:
    decoder = _decoders.get(result_type)
    if decoder is None:
        decoder = _decoders[result_type] = msgspec.json.Decoder(result_type)
    return decoder


# The methods both clients offer, once: each builds its ``Call`` (no I/O);
# :func:`blocking` and :func:`awaiting` make it a ``Client`` and an
# ``AsyncClient`` method with the same signature and docstring.


def ping() -> Call[PingResult]:
    """``ping``: is the daemon there, and which version."""
    return Call("ping", None, PingResult)


def status() -> Call[StatusResult]:
    """``status``: the daemon's state and counters."""
    return Call("status", None, StatusResult)


def snapshot(
    *,
    task: str | None = None,
    timeout_ms: int | None = None,
    max_age_ms: int | None = None,
    since: int | None = None,
    usage: bool = False,
    fresh: bool = False,
    commands: bool = False,
    ports: bool = False,
) -> Call[ActiveSessionsSnapshot]:
    """``sessions.snapshot`` (docs/design.md §7); params as in ``SnapshotParams``.

    Args:
        commands: each process carries ``command``, its argv as the OS
            says it (``None`` where it does not), docs/design.md §5.
        ports: each process carries ``ports``, the sockets it listens on
            (``None`` where the OS does not say), docs/design.md §13.
        fresh: read-your-writes: the answer reflects every receipt, store
            row and process exit completed before the call (``max_age_ms=0``:
            the daemon waits for its watch's barrier, then observes).

    Raises:
        ValueError: ``fresh`` with a ``max_age_ms`` other than 0.
    """
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
        ("ports", ports or None),
    ):
        if value is not None:
            params[name] = value
    wait_ms = DEFAULT_SNAPSHOT_TIMEOUT_MS if timeout_ms is None else timeout_ms
    return Call(
        "sessions.snapshot",
        params,
        ActiveSessionsSnapshot,
        min_timeout_s=wait_ms / 1000 + _SERVER_WAIT_MARGIN_S,
    )


def reconcile(from_session: str, this_session: str, context_id: str) -> Call[LostReport | None]:
    """``session.reconcile`` (docs/design.md §6): ``from_session``'s lost work, or ``None``."""
    params = {"from_session": from_session, "this_session": this_session, "context_id": context_id}
    # The daemon may wait this long for the trace's lock, then scan: don't give up first.
    wait_s = TRACE_LOCK_TIMEOUT_S + _RECONCILE_SCAN_ALLOWANCE_S
    return Call("session.reconcile", params, LostReport | None, min_timeout_s=wait_s)


def metrics() -> Call[MetricsResult]:
    """``metrics``: the daemon's figures as OpenMetrics text (docs/design.md §7)."""
    return Call("metrics", None, MetricsResult)


def rescan() -> Call[RescanResult]:
    """``reader.rescan``: the next observation walks the home from scratch."""
    return Call("reader.rescan", None, RescanResult)


def terminate(
    session_id: str,
    *,
    signal: TerminateSignal = "TERM",
    grace_s: float = DEFAULT_GRACE_MS / 1000,
    commands: bool = False,
    spare: Iterable[tuple[int, int]] = (),
    ended_only: bool = False,
) -> Call[TerminateReport]:
    """``session.terminate`` (docs/design.md §7): signal every live process of the
    session, ``SIGKILL`` what is left after ``grace_s`` seconds, report each outcome.

    The call waits the grace out (the client's timeout is raised to cover it).
    ``commands``: each process in the report carries its ``command``.
    ``spare``: (pid, start time in Unix seconds) of processes of the session not
    to signal; the report lists them with the outcome ``spared`` (docs/design.md §11).
    ``ended_only``: only if the session is ended, its leftovers (docs/design.md §13).

    Raises:
        NoSuchSession: the session is not active in the daemon's fresh observation
            (with ``ended_only``, also when it is running: ``data["state"]`` is
            ``"running"``).
        ValueError: ``grace_s`` is outside [0, 3600].
    """
    if not 0 <= grace_s <= MAX_PARAM_MS / 1000:
        raise ValueError(
            f"grace_s must be within [0, {MAX_PARAM_MS / 1000:g}] seconds, not {grace_s!r}"
        )
    grace_ms = round(grace_s * 1000)
    params: dict[str, Any] = {"session_id": session_id, "signal": signal, "grace_ms": grace_ms}
    if commands:
        params["commands"] = True
    spared = [{"pid": pid, "started_at": started_at} for pid, started_at in spare]
    if spared:
        params["spare"] = spared
    if ended_only:
        params["ended_only"] = True
    wait_s = grace_ms / 1000 + _TERMINATE_ALLOWANCE_S
    return Call("session.terminate", params, TerminateReport, min_timeout_s=wait_s)


class _Blocking(Protocol):
    def _call(self, call: Call[T]) -> T: ...


class _Awaiting(Protocol):
    async def _call(self, call: Call[T]) -> T: ...


def blocking(build: Callable[P, Call[T]]) -> Callable[Concatenate[_Blocking, P], T]:
    """``build`` as a method of the blocking client: build the call, send it, return its result."""

    @functools.wraps(build)
    def method(self: _Blocking, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._call(build(*args, **kwargs))

    return _as_method(method, build)


def awaiting(
    build: Callable[P, Call[T]],
) -> Callable[Concatenate[_Awaiting, P], Coroutine[Any, Any, T]]:
    """``build`` as a method of the async client: the same, awaited."""

    @functools.wraps(build)
    async def method(self: _Awaiting, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._call(build(*args, **kwargs))

    return _as_method(method, build)


def _as_method(method: M, build: Callable[..., Any]) -> M:
    """``method`` with ``build``'s signature as ``help()`` shows it: ``self`` first, the
    result in place of its ``Call``."""
    signature = inspect.signature(build)
    result = signature.return_annotation
    if isinstance(result, str) and result.startswith("Call[") and result.endswith("]"):
        result = result[len("Call[") : -1]
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self, *signature.parameters.values()], return_annotation=result
    )
    return method


def subscribe(
    since: int | None, commands: bool = False, *, ports: bool = False
) -> Call[SubscribeResult]:
    params: dict[str, Any] = {}
    if since is not None:
        params["since"] = since
    if commands:
        params["commands"] = True
    if ports:
        params["ports"] = True
    return Call("sessions.subscribe", params or None, SubscribeResult)


def unsubscribe(subscription: str) -> Call[UnsubscribeResult]:
    return Call("sessions.unsubscribe", {"subscription": subscription}, UnsubscribeResult)


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
                event: SessionsChanged | SessionsDropped = _decoder_for(SessionsChanged).decode(
                    message.params
                )
            elif message.method == SESSIONS_DROPPED:
                event = _decoder_for(SessionsDropped).decode(message.params)
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
