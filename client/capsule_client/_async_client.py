"""The async client (anyio): the same methods as :class:`~capsule_client.Client`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
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

__all__ = ["AsyncClient", "AsyncSubscription"]

T = TypeVar("T")


class AsyncClient:
    """Talks to capsuled from anyio code (asyncio or trio).

    Calls on one client are sent one at a time (a lock keeps replies in
    order); make several clients for concurrency.

    Args and raises: as :class:`~capsule_client.Client`.
    """

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        self._core = ClientCore(socket_path, timeout_s, max_reply_bytes)
        self._stream: SocketStream | None = None
        self._reader: BufferedByteReceiveStream | None = None
        self._lock = anyio.Lock()

    @property
    def socket_path(self) -> Path:
        """The socket this client talks to."""
        return self._core.socket_path

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

    async def ping(self) -> PingResult:
        """``ping``: is the daemon there, and which version."""
        return await self._call(_core.ping())

    async def status(self) -> StatusResult:
        """``status``: the daemon's state and counters."""
        return await self._call(_core.status())

    async def snapshot(
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
        return await self._call(
            _core.snapshot(task, timeout_ms, max_age_ms, since, usage, fresh, commands)
        )

    def subscribe(self, *, since: int | None = None, commands: bool = False) -> AsyncSubscription:
        """``sessions.subscribe``: an async iterator of the answer's changes.

        >>> async with client.subscribe() as changes:   # doctest: +SKIP
        ...     async for change in changes:            # SessionsChanged, first full
        ...         print(change.generation, change.added, change.removed)

        The subscription uses this client's connection: while one task
        iterates, make calls from another client. See :class:`AsyncSubscription`.
        """
        return AsyncSubscription(self, since, commands)

    async def reconcile(
        self, from_session: str, this_session: str, context_id: str
    ) -> LostReport | None:
        """``session.reconcile`` (docs/design.md §6): ``from_session``'s lost work, or ``None``."""
        return await self._call(_core.reconcile(from_session, this_session, context_id))

    async def metrics(self) -> MetricsResult:
        """``metrics``: the daemon's figures as OpenMetrics text (docs/design.md §7)."""
        return await self._call(_core.metrics())

    async def terminate(
        self,
        session_id: str,
        *,
        signal: TerminateSignal = "TERM",
        grace_s: float = 5.0,
        commands: bool = False,
    ) -> TerminateReport:
        """``session.terminate`` (docs/design.md §7): as :meth:`Client.terminate`."""
        return await self._call(_core.terminate(session_id, signal, grace_s, commands))

    async def rescan(self) -> RescanResult:
        """``reader.rescan``: the next observation walks the home from scratch."""
        return await self._call(_core.rescan())

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
                raise RequestTimeout(f"no reply to {call.method} from {self.socket_path}") from exc
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


class AsyncSubscription:
    """A ``sessions.subscribe`` subscription: an async iterator of
    :class:`~.protocol.SessionsChanged`, the first with ``full: true``.

    Subscribes on entering (or on the first ``anext``); :meth:`aclose` (or
    leaving the ``async with`` block) unsubscribes.

    Raises (from iterating):
        SubscriptionDropped: the daemon dropped the subscription (it fell
            behind); subscribe again for a fresh full answer.
        ConnectionLost: the daemon went away.
    """

    def __init__(self, client: AsyncClient, since: int | None, commands: bool = False) -> None:
        self._client = client
        self._since = since
        self._commands = commands
        self.id: str | None = None

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
        if self.id is None:
            result = await self._client._call(_core.subscribe(self._since, self._commands))
            self.id = result.subscription
            self._client._core.subscribed(self.id)
        return self.id

    async def aclose(self) -> None:
        """Unsubscribe (if the connection is still there); idempotent."""
        subscription, self.id = self.id, None
        if subscription is None:
            return
        self._client._core.unsubscribed(subscription)
        if self._client._stream is not None:
            with anyio.CancelScope(shield=True):
                await self._client._call(_core.unsubscribe(subscription))
            self._client._core.unsubscribed(subscription)
