"""The blocking client: one Unix-socket connection, opened on first use."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from msgspec import Raw

from . import _core
from ._core import DEFAULT_TIMEOUT_S, MAX_REPLY_BYTES, Call, ClientCore
from ._exceptions import ConnectionLost, DaemonNotRunning, RequestTimeout
from .protocol import (
    ActiveSessionsSnapshot,
    LostReport,
    MetricsResult,
    PingResult,
    RescanResult,
    SessionsChanged,
    StatusResult,
    TerminateReport,
    TerminateSignal,
)

__all__ = ["Client", "Subscription"]

T = TypeVar("T")


class Client:
    """Talks to capsuled, blocking. Not thread-safe: one per thread.

    Args:
        socket_path: the daemon's socket; default per docs/design.md §2
            (``$CAPSULED_SOCKET``, ``$XDG_RUNTIME_DIR/capsuled.sock``, ...).
        timeout_s: seconds to wait for each reply (long polls wait longer).
        max_reply_bytes: the longest line accepted from the daemon (default
            1 GiB: a reconcile of 300,000 lost works is about 90 MB).

    Raises (from every method):
        DaemonNotRunning: nothing accepts connections on the socket.
        RequestTimeout: no reply in time (the connection is closed).
        ConnectionLost: the daemon closed the connection before answering.
        ProtocolError: what came back is not a JSON-RPC reply, or is longer
            than ``max_reply_bytes`` (the connection is closed).
        RemoteError: the daemon answered an error (a subclass per code).
        ClientClosed: the client was used after :meth:`close`.
    """

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        self._core = ClientCore(socket_path, timeout_s, max_reply_bytes)
        self._sock: socket.socket | None = None
        self._buffer = bytearray()

    @property
    def socket_path(self) -> Path:
        """The socket this client talks to."""
        return self._core.socket_path

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; the client cannot be used again."""
        self._core.closed = True
        self._disconnect()

    def ping(self) -> PingResult:
        """``ping``: is the daemon there, and which version."""
        return self._call(_core.ping())

    def status(self) -> StatusResult:
        """``status``: the daemon's state and counters."""
        return self._call(_core.status())

    def snapshot(
        self,
        *,
        task: str | None = None,
        timeout_ms: int | None = None,
        max_age_ms: int | None = None,
        since: int | None = None,
        usage: bool = False,
        fresh: bool = False,
        commands: bool = False,
    ) -> ActiveSessionsSnapshot:
        """``sessions.snapshot`` (docs/design.md §7); params as in ``SnapshotParams``.

        Args:
            commands: each process carries ``command``, its argv as the OS
                says it (``None`` where it does not), docs/design.md §5.
            fresh: read-your-writes: the answer reflects every receipt, store
                row and process exit completed before the call (``max_age_ms=0``:
                the daemon waits for its watch's barrier, then observes).

        Raises:
            ValueError: ``fresh`` with a ``max_age_ms`` other than 0.
        """
        return self._call(
            _core.snapshot(task, timeout_ms, max_age_ms, since, usage, fresh, commands)
        )

    def subscribe(self, *, since: int | None = None, commands: bool = False) -> Subscription:
        """``sessions.subscribe``: iterate the answer's changes as they happen.

        >>> with client.subscribe() as changes:      # doctest: +SKIP
        ...     for change in changes:               # SessionsChanged, first full
        ...         print(change.generation, change.added, change.removed)

        Iterating blocks until the next change; the subscription uses this
        client's connection, so make calls from another client meanwhile.
        See :class:`Subscription`.
        """
        return Subscription(self, since, commands)

    def reconcile(self, from_session: str, this_session: str, context_id: str) -> LostReport | None:
        """``session.reconcile`` (docs/design.md §6): ``from_session``'s lost work, or ``None``."""
        return self._call(_core.reconcile(from_session, this_session, context_id))

    def metrics(self) -> MetricsResult:
        """``metrics``: the daemon's figures as OpenMetrics text (docs/design.md §7)."""
        return self._call(_core.metrics())

    def terminate(
        self,
        session_id: str,
        *,
        signal: TerminateSignal = "TERM",
        grace_s: float = 5.0,
        commands: bool = False,
    ) -> TerminateReport:
        """``session.terminate`` (docs/design.md §7): signal every live process of the
        session, ``SIGKILL`` what is left after ``grace_s`` seconds, report each outcome.

        The call waits the grace out (the client's timeout is raised to cover it).
        With ``commands``, each process carries its ``command`` (docs/design.md §5).

        Raises:
            NoSuchSession: the session is not active in the daemon's fresh observation.
            ValueError: ``grace_s`` is outside [0, 3600].
        """
        return self._call(_core.terminate(session_id, signal, grace_s, commands))

    def rescan(self) -> RescanResult:
        """``reader.rescan``: the next observation walks the home from scratch."""
        return self._call(_core.rescan())

    def call_raw(
        self, method: str, params: dict[str, Any] | None = None, *, min_timeout_s: float = 0.0
    ) -> bytes:
        """Call any method; the result exactly as it came over the wire (JSON bytes).

        ``min_timeout_s`` raises the client's timeout for this call (as the
        typed methods do for calls the daemon may hold, such as a reconcile).
        """
        return bytes(self._roundtrip(Call(method, params, Any, min_timeout_s)))

    def _call(self, call: Call[T]) -> T:
        return ClientCore.decode(call, self._roundtrip(call))

    def _roundtrip(self, call: Call[Any]) -> Raw:
        self._core.check_open()
        request_id, data = self._core.encode(call)
        deadline = time.monotonic() + self._core.timeout_for(call)
        sock = self._connect()
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                # The daemon may refuse a connection with one error line (-32002
                # overloaded, -32006 permission denied) and close it before the
                # request arrives: that line says why, so read it.
                pass
            while True:
                result = self._core.read_reply(request_id, self._read_line(sock, deadline))
                if result is not None:
                    return result
        except TimeoutError as exc:
            self._disconnect()
            raise RequestTimeout(f"no reply to {call.method} from {self.socket_path}") from exc
        except OSError as exc:
            self._disconnect()
            raise ConnectionLost(f"lost the connection to {self.socket_path}: {exc}") from exc
        except BaseException:
            self._disconnect()
            raise

    def _next_change(self, subscription: str, timeout_s: float | None = None) -> SessionsChanged:
        """Block until the daemon sends a change of ``subscription`` (or ``timeout_s`` passes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            change = self._core.next_change(subscription)
            if change is not None:
                return change
            sock = self._sock
            if sock is None:
                raise ConnectionLost(f"the connection to {self.socket_path} is closed")
            try:
                line = self._read_line(sock, deadline)
            except TimeoutError as exc:  # the subscription goes on
                raise RequestTimeout(f"no change within {timeout_s} s") from exc
            except OSError as exc:
                self._disconnect()
                raise ConnectionLost(f"lost the connection to {self.socket_path}: {exc}") from exc
            self._core.read_notification(line)

    def _read_line(self, sock: socket.socket, deadline: float | None) -> bytes:
        """The next line from the daemon, without its ``\\n``.

        Raises:
            TimeoutError: ``deadline`` (``time.monotonic()``) passed first.
            ConnectionLost: the daemon closed the connection.
            ProtocolError: the line is longer than ``max_reply_bytes`` (the
                connection is closed).
        """
        buffer, limit = self._buffer, self._core.max_reply_bytes
        searched = 0  # bytes already searched for the line end: a long reply is searched once
        while True:
            end = buffer.find(b"\n", searched)
            if end > limit or (end < 0 and len(buffer) > limit):
                self._disconnect()
                raise self._core.too_long()
            if end >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                return line
            searched = len(buffer)
            if deadline is None:
                sock.settimeout(None)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionLost(f"the daemon at {self.socket_path} closed the connection")
            buffer += chunk

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._core.timeout_s)
        deadline = time.monotonic() + self._core.timeout_s
        while True:
            try:
                sock.connect(str(self.socket_path))
                break
            except BlockingIOError as exc:
                # EAGAIN: the daemon's listen backlog is full. It is there and busy,
                # not gone: wait for room until the timeout, as a blocking connect would.
                if time.monotonic() >= deadline:
                    sock.close()
                    raise RequestTimeout(
                        f"{self.socket_path} accepted no connection within "
                        f"{self._core.timeout_s} s: its listen backlog stayed full"
                    ) from exc
                time.sleep(0.005)
            except OSError as exc:
                sock.close()
                raise DaemonNotRunning(self.socket_path, exc.strerror or str(exc)) from exc
        self._sock = sock
        self._buffer.clear()
        return sock

    def _disconnect(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer.clear()


class Subscription:
    """A ``sessions.subscribe`` subscription: an iterator of
    :class:`~.protocol.SessionsChanged`, the first with ``full: true``.

    Subscribes on entering (or on the first ``next``); :meth:`close` (or
    leaving the ``with`` block) unsubscribes. Iterating blocks until the
    daemon sends a change.

    Raises (from iterating):
        SubscriptionDropped: the daemon dropped the subscription (it fell
            behind); subscribe again for a fresh full answer.
        ConnectionLost: the daemon went away.
    """

    def __init__(self, client: Client, since: int | None, commands: bool = False) -> None:
        self._client = client
        self._since = since
        self._commands = commands
        self.id: str | None = None

    def __enter__(self) -> Subscription:
        self._start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[SessionsChanged]:
        return self

    def __next__(self) -> SessionsChanged:
        return self._client._next_change(self._start())

    def next(self, timeout_s: float | None = None) -> SessionsChanged:
        """The next change, waiting at most ``timeout_s`` (None: for ever).

        Raises:
            RequestTimeout: no change within ``timeout_s``; the subscription goes on.
        """
        return self._client._next_change(self._start(), timeout_s)

    def _start(self) -> str:
        if self.id is None:
            result = self._client._call(_core.subscribe(self._since, self._commands))
            self.id = result.subscription
            self._client._core.subscribed(self.id)
        return self.id

    def close(self) -> None:
        """Unsubscribe (if the connection is still there); idempotent."""
        subscription, self.id = self.id, None
        if subscription is None:
            return
        self._client._core.unsubscribed(subscription)
        if self._client._sock is not None:
            self._client._call(_core.unsubscribe(subscription))
            self._client._core.unsubscribed(subscription)
