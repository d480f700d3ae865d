"""The blocking client: one Unix-socket connection, opened on first use."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, TypeVar

from msgspec import Raw

from . import calls
from .base import BaseClient, ClientCore, SubscriptionBase
from .calls import Call
from .errors import ConnectionLost, DaemonNotRunning, RequestTimeout
from .wire import SessionsChanged

__all__ = ["Client", "Subscription"]

T = TypeVar("T")


class Client(BaseClient):
    """Talks to capsuled, blocking. Not thread-safe: one per thread.

    Args and raises: as :class:`~.base.BaseClient` says.
    """

    def _unconnected(self) -> None:
        self._sock: socket.socket | None = None
        self._buffer = bytearray()

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

    ping = calls.blocking(calls.ping)
    status = calls.blocking(calls.status)
    snapshot = calls.blocking(calls.snapshot)
    reconcile = calls.blocking(calls.reconcile)
    metrics = calls.blocking(calls.metrics)
    terminate = calls.blocking(calls.terminate)
    rescan = calls.blocking(calls.rescan)

    def subscribe(
        self, *, since: int | None = None, commands: bool = False, ports: bool = False
    ) -> Subscription:
        """``sessions.subscribe``: iterate the answer's changes as they happen.

        >>> with client.subscribe() as changes:      # doctest: +SKIP
        ...     for change in changes:               # SessionsChanged, first full
        ...         print(change.generation, change.added, change.removed)

        Iterating blocks until the next change; the subscription uses this
        client's connection, so make calls from another client meanwhile.
        See :class:`Subscription`.
        """
        return Subscription(self, since, commands, ports=ports)

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
            raise RequestTimeout(
                f"no reply to {call.method} from {self.socket_path} within "
                f"{self._core.timeout_for(call):g} s"
            ) from exc
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


class Subscription(SubscriptionBase):
    """A ``sessions.subscribe`` subscription: an iterator of
    :class:`~.wire.SessionsChanged`, the first with ``full: true``.

    Subscribes on entering (or on the first ``next``); :meth:`close` (or
    leaving the ``with`` block) unsubscribes. Iterating blocks until the
    daemon sends a change. Raises as :class:`~.base.SubscriptionBase` says.
    """

    def __init__(
        self, client: Client, since: int | None, commands: bool = False, *, ports: bool = False
    ) -> None:
        super().__init__(since, commands, ports=ports)
        self._client = client

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
        if self.id is not None:
            return self.id
        return self._subscribed(self._client._core, self._client._call(self._subscribe()))

    def close(self) -> None:
        """Unsubscribe (if the connection is still there); idempotent."""
        subscription = self._leave(self._client._core)
        if subscription is not None and self._client._sock is not None:
            self._client._call(calls.unsubscribe(subscription))
            self._client._core.unsubscribed(subscription)
