"""The async client (anyio): the same methods as :class:`~capsule_client.Client`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from msgspec import Raw

from . import calls
from .base import BaseClient, ClientCore, SubscriptionBase
from .calls import Call
from .errors import ConnectionLost, DaemonNotRunning, RequestTimeout
from .wire import SessionsChanged

__all__ = ["AsyncClient", "AsyncSubscription"]

T = TypeVar("T")


class AsyncClient(BaseClient):
    """Talks to capsuled from anyio code (asyncio or trio).

    Calls on one client are sent one at a time (a lock keeps replies in
    order); make several clients for concurrency.

    Args and raises: as :class:`~.base.BaseClient` says.
    """

    def _unconnected(self) -> None:
        self._stream: SocketStream | None = None
        self._reader: BufferedByteReceiveStream | None = None
        self._lock = anyio.Lock()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; the client cannot be used again."""
        self._core.closed = True
        await self._disconnect()

    ping = calls.awaiting(calls.ping)
    status = calls.awaiting(calls.status)
    snapshot = calls.awaiting(calls.snapshot)
    reconcile = calls.awaiting(calls.reconcile)
    metrics = calls.awaiting(calls.metrics)
    terminate = calls.awaiting(calls.terminate)
    rescan = calls.awaiting(calls.rescan)

    def subscribe(
        self, *, since: int | None = None, commands: bool = False, ports: bool = False
    ) -> AsyncSubscription:
        """``sessions.subscribe``: an async iterator of the answer's changes.

        >>> async with client.subscribe() as changes:   # doctest: +SKIP
        ...     async for change in changes:            # SessionsChanged, first full
        ...         print(change.generation, change.added, change.removed)

        The subscription uses this client's connection: while one task
        iterates, make calls from another client. See :class:`AsyncSubscription`.
        """
        return AsyncSubscription(self, since, commands, ports=ports)

    async def call_raw(
        self, method: str, params: dict[str, Any] | None = None, *, min_timeout_s: float = 0.0
    ) -> bytes:
        """Call any method; the result exactly as it came over the wire (JSON bytes).

        ``min_timeout_s`` raises the client's timeout for this call (as the
        typed methods do for calls the daemon may hold, such as a reconcile).
        """
        return bytes(await self._roundtrip(Call(method, params, Any, min_timeout_s)))

    async def _call(self, call: Call[T]) -> T:
        return ClientCore.decode(call, await self._roundtrip(call))

    async def _roundtrip(self, call: Call[Any]) -> Raw:
        self._core.check_open()
        async with self._lock:
            request_id, data = self._core.encode(call)
            try:
                with anyio.fail_after(self._core.timeout_for(call)):
                    stream, reader = await self._connect()
                    try:
                        await stream.send(data)
                    except anyio.BrokenResourceError:
                        pass  # refused before the request arrived: read why (see Client)
                    while True:
                        line = await self._line(reader)
                        result = self._core.read_reply(request_id, line)
                        if result is not None:
                            return result
            except TimeoutError as exc:
                await self._disconnect()
                raise RequestTimeout(
                    f"no reply to {call.method} from {self.socket_path} within "
                    f"{self._core.timeout_for(call):g} s"
                ) from exc
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
                await self._disconnect()
                raise ConnectionLost(
                    f"the daemon at {self.socket_path} closed the connection"
                ) from exc
            except BaseException:
                await self._disconnect()
                raise

    async def _next_change(self, subscription: str) -> SessionsChanged:
        """Wait until the daemon sends a change of ``subscription``."""
        async with self._lock:
            while True:
                change = self._core.next_change(subscription)
                if change is not None:
                    return change
                reader = self._reader
                if reader is None:
                    raise ConnectionLost(f"the connection to {self.socket_path} is closed")
                try:
                    line = await self._line(reader)
                except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
                    await self._disconnect()
                    raise ConnectionLost(
                        f"the daemon at {self.socket_path} closed the connection"
                    ) from exc
                self._core.read_notification(line)

    async def _line(self, reader: BufferedByteReceiveStream) -> bytes:
        """The next line from the daemon; raises ``ProtocolError`` past ``max_reply_bytes``
        (and closes the connection).

        anyio's ``receive_until`` (4.16) refuses a buffer of ``max_bytes``
        without a line end before reading on, yet returns a longer line that
        arrived whole: one byte more than the limit, and a check of the line,
        make the limit the same however the reply is split into reads.
        """
        limit = self._core.max_reply_bytes
        try:
            line = await reader.receive_until(b"\n", limit + 1)
        except anyio.DelimiterNotFound:
            line = None
        if line is None or len(line) > limit:
            await self._disconnect()
            raise self._core.too_long()
        return line

    async def _connect(self) -> tuple[SocketStream, BufferedByteReceiveStream]:
        if self._stream is None or self._reader is None:
            try:
                self._stream = await anyio.connect_unix(self.socket_path)
            except OSError as exc:
                raise DaemonNotRunning(self.socket_path, exc.strerror or str(exc)) from exc
            self._reader = BufferedByteReceiveStream(self._stream)
        return self._stream, self._reader

    async def _disconnect(self) -> None:
        stream, self._stream, self._reader = self._stream, None, None
        if stream is not None:
            with anyio.CancelScope(shield=True):
                await stream.aclose()


class AsyncSubscription(SubscriptionBase):
    """A ``sessions.subscribe`` subscription: an async iterator of
    :class:`~.wire.SessionsChanged`, the first with ``full: true``.

    Subscribes on entering (or on the first ``anext``); :meth:`aclose` (or
    leaving the ``async with`` block) unsubscribes. Raises as
    :class:`~.base.SubscriptionBase` says.
    """

    def __init__(
        self, client: AsyncClient, since: int | None, commands: bool = False, *, ports: bool = False
    ) -> None:
        super().__init__(since, commands, ports=ports)
        self._client = client

    async def __aenter__(self) -> AsyncSubscription:
        await self._start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[SessionsChanged]:
        return self

    async def __anext__(self) -> SessionsChanged:
        return await self._client._next_change(await self._start())

    async def _start(self) -> str:
        if self.id is not None:
            return self.id
        return self._subscribed(self._client._core, await self._client._call(self._subscribe()))

    async def aclose(self) -> None:
        """Unsubscribe (if the connection is still there); idempotent."""
        subscription = self._leave(self._client._core)
        if subscription is not None and self._client._stream is not None:
            with anyio.CancelScope(shield=True):
                await self._client._call(calls.unsubscribe(subscription))
            self._client._core.unsubscribed(subscription)
