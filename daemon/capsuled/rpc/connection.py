"""One client connection: its lines in, its lines out (docs/design.md §7).

A connection's task reads its lines from its anyio stream and answers them
one at a time, in order (:meth:`Connection.converse`): a line is read only
once the one before it is answered, so a peer that sends faster than it is
answered fills its socket buffer, not the daemon's memory. Every line
written, replies and the notifications subscriptions push, goes through
:meth:`Connection.send_line`, one line at a time, within the write timeout.
A long request is ended when its peer hangs up
(:meth:`Connection.unless_peer_leaves`), which :class:`HangUps` watches for
every connection at once.
"""

from __future__ import annotations

import contextvars
import select
import socket
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar, cast

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import SocketStream

from capsule_client.wire import INVALID_REQUEST, MAX_MESSAGE_BYTES
from capsuled.common.shortage import is_shortage

from .jsonrpc import SPLICE_MIN_BYTES, encode_error

__all__ = ["Connection", "HangUps", "LineHandler", "current_connection"]

T = TypeVar("T")

log = structlog.get_logger("capsuled.server")

#: The connection whose request is being handled (for methods that push
#: notifications later, such as subscriptions).
current_connection: contextvars.ContextVar[Connection] = contextvars.ContextVar(
    "current_connection"
)

_RECEIVE_CHUNK: Final = 65536
#: Lines answered one after the other without waiting before the connection
#: lets other tasks run (a peer pipelining notifications, which get no reply).
_YIELD_EVERY: Final = 16
#: A whole line shorter than this is joined into one buffer before it is sent.
_JOIN_LINE_BELOW_BYTES: Final = 1024 * 1024
#: Unread input dropped at most when a connection closes (see :meth:`Connection.discard_unread`).
_DISCARD_MAX_BYTES: Final = 4 * MAX_MESSAGE_BYTES
#: Without epoll (not Linux), how often a peer is asked whether it hung up.
_HANG_UP_POLL_S: Final = 0.2

#: An answer to a line: whether the connection goes on.
LineHandler = Callable[[bytes], Awaitable[bool]]


class Connection:
    """One client connection: its lines in, its lines out, and whether it is busy.

    Args:
        stream: the accepted connection.
        number: its number in the daemon's log.
        write_timeout_s: how long a line may wait for the peer to read it.
    """

    def __init__(self, stream: SocketStream, number: int, write_timeout_s: float) -> None:
        self.stream = stream
        self.number = number
        self.busy = False
        self.scope = anyio.CancelScope()
        #: Set once the connection has ended (subscriptions end with it).
        self.closed = anyio.Event()
        self._write_timeout_s = write_timeout_s
        self._send_lock = anyio.Lock(fast_acquire=True)
        #: False while a line is being written, and for good once one was cut
        #: short: the peer may hold part of a line, and another would read as its end.
        self._writable = True
        self._after_reply: list[Callable[[], None]] = []
        self._raw_socket: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        self._guarded = 0  # requests in unless_peer_leaves
        #: Whether a :class:`HangUps` watches this connection's peer.
        self.watched = False
        #: Whether the peer closed both directions (seen by :class:`HangUps`).
        self.hung_up = False

    async def converse(self, answer: LineHandler) -> None:
        """Read lines and give them to ``answer`` one at a time, in order.

        Ends at end-of-stream (after a last line without its ``\\n``), when
        ``answer`` returns ``False``, or after answering a line longer than
        ``MAX_MESSAGE_BYTES`` with -32600.
        """
        buffer = bytearray()
        searched = 0  # bytes of ``buffer`` known to hold no newline
        unwaited = 0  # lines answered since the last receive
        while True:
            at = buffer.find(b"\n", searched)
            if at < 0:
                searched = len(buffer)
                if searched > MAX_MESSAGE_BYTES:
                    await self._refuse_too_long()
                    return
                unwaited = 0
                try:
                    data = await self.stream.receive(_RECEIVE_CHUNK)
                except anyio.EndOfStream:
                    if buffer:
                        await answer(bytes(buffer))  # a last line without its newline
                    return
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # reset: gone, not half-closed; no last line
                buffer += data
                continue
            if at > MAX_MESSAGE_BYTES:
                await self._refuse_too_long()
                return
            line = bytes(buffer[:at])
            del buffer[: at + 1]  # from the front of a bytearray: no copy of the rest
            searched = 0
            unwaited += 1
            if unwaited >= _YIELD_EVERY:
                unwaited = 0
                await anyio.lowlevel.checkpoint()
            if not await answer(line):
                return

    async def _refuse_too_long(self) -> None:
        await self.send_line(
            encode_error(
                INVALID_REQUEST,
                f"invalid request: message longer than {MAX_MESSAGE_BYTES} bytes; "
                "closing the connection",
            )
        )

    def call_after_reply(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the reply to the request being handled is sent
        (a subscription's first notification must follow its reply)."""
        self._after_reply.append(callback)

    def replied(self) -> None:
        """The current request's reply went out (or none was owed): run the callbacks."""
        if not self._after_reply:
            return  # nearly every request: nothing to run, nothing to allocate
        callbacks, self._after_reply = self._after_reply, []
        for callback in callbacks:
            callback()

    async def unless_peer_leaves(self, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()``; if the peer hangs up meanwhile, end the connection.

        A long poll may wait up to an hour for a change: a client that gave up
        must not keep its connection slot (and the poll) alive that long. A
        half-closed peer still waits for its answer (docs/protocol.md); one
        that closed both directions, or whose socket failed, is gone.
        Watched by :class:`HangUps`, this costs a counter; otherwise a task
        of its own waits for the hang-up.
        """
        self._guarded += 1
        try:
            if self.hung_up:
                self.peer_hung_up()
            if self.watched:
                return await call()
            async with anyio.create_task_group() as watch:
                watch.start_soon(self._end_at_hang_up)
                try:
                    result = await call()
                finally:
                    watch.cancel_scope.cancel()
            return result
        finally:
            self._guarded -= 1

    def peer_hung_up(self) -> None:
        """The peer closed both directions: end the connection if a request waits for it."""
        self.hung_up = True
        if self._guarded:
            log.debug("peer left during a request; ending it", connection=self.number)
            self.scope.cancel()

    async def _end_at_hang_up(self) -> None:
        await _hung_up(self._raw_socket)
        self.peer_hung_up()

    def end_reading(self) -> None:
        """Make the pending read see end-of-stream, so the connection ends by itself.

        Shutting the socket down for reading is gentler than cancelling the
        read: the pending receive sees end-of-stream, and the connection
        closes after the line being answered, if any.
        """
        try:
            self._raw_socket.shutdown(socket.SHUT_RD)
        except OSError:
            self.scope.cancel()

    def discard_unread(self) -> None:
        """Drop what the peer sent and was not read, before the socket is closed.

        Closing a Unix socket with unread input resets the connection, and
        the peer may then lose replies it has not read yet. What is queued
        now is read and dropped (at most ``_DISCARD_MAX_BYTES``), without waiting.
        """
        dropped = 0
        try:
            while dropped < _DISCARD_MAX_BYTES:
                chunk = self._raw_socket.recv(_RECEIVE_CHUNK, socket.MSG_DONTWAIT)
                if not chunk:
                    return
                dropped += len(chunk)
        except OSError:  # nothing more (EAGAIN), or the socket failed
            return

    async def send_line(self, *parts: bytes | memoryview) -> bool:
        """Send one message (in ``parts``) and its newline; ``False`` if the peer is gone or stuck.

        Replies and notifications take the same lock, so lines never
        interleave. Small parts are joined (with the newline); a part of at
        least :data:`~capsuled.rpc.jsonrpc.SPLICE_MIN_BYTES` is sent from its own buffer: a snapshot
        reply of megabytes goes out from discovery's encoded buffer, not a copy.
        A line not sent within the write timeout drops the connection.

        Once a line was cut short (a failed send, the write timeout, a
        cancelled sender), every later line is refused: the peer may hold
        part of a line, and another line would read as its end.
        """
        async with self._send_lock:
            if not self._writable:
                return False
            self._writable = False  # until the whole line is out
            with anyio.move_on_after(self._write_timeout_s) as timeout:
                try:
                    for chunk in _chunks(parts):
                        # The socket stream sends any buffer, a memoryview too.
                        await self.stream.send(cast(bytes, chunk))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return False
                self._writable = True
                return True
            if timeout.cancelled_caught:
                log.warning(
                    "dropping a connection that does not read its replies",
                    connection=self.number,
                    write_timeout_s=self._write_timeout_s,
                )
            return False

    @property
    def writing(self) -> bool:
        """Whether a line is being written (others wait for it)."""
        return self._send_lock.locked()

    def notify_closing(self) -> None:
        """Wake tasks waiting on the socket with ``anyio.wait_*``: it is about to be closed."""
        if self._raw_socket.fileno() >= 0:
            anyio.notify_closing(self._raw_socket)


def _chunks(parts: tuple[bytes | memoryview, ...]) -> list[bytes | memoryview]:
    """One line's parts and its newline, the small ones joined: what to send, in order.

    A line shorter than ``_JOIN_LINE_BELOW_BYTES`` is one chunk: one copy
    costs less than a send per part.
    """
    if sum(len(part) for part in parts) < _JOIN_LINE_BELOW_BYTES:
        return [b"".join((*parts, b"\n"))]
    chunks: list[bytes | memoryview] = []
    small: list[bytes | memoryview] = []
    for part in parts:
        if len(part) < SPLICE_MIN_BYTES:  # joined with its neighbours
            small.append(part)
            continue
        if small:
            chunks.append(b"".join(small))
            small = []
        chunks.append(part)
    small.append(b"\n")
    chunks.append(b"".join(small))
    return chunks


class HangUps:
    """Tells connections that their peer hung up, for every connection at once.

    Each connection's socket is registered with one epoll descriptor with no
    events: epoll reports a hang-up (the peer closed both directions) and an
    error by itself, and a half-close is neither. One task waits for the
    descriptor to be readable. Without epoll (not Linux) nothing is watched
    here, and :meth:`Connection.unless_peer_leaves` asks the socket itself;
    so too when the daemon starts short of descriptors (docs/design.md §8).
    """

    def __init__(self) -> None:
        self._epoll: select.epoll | None = None
        if hasattr(select, "epoll"):
            try:
                self._epoll = select.epoll()
            except OSError as exc:
                if not is_shortage(exc):
                    raise
                log.warning("hang-ups are asked of each socket: no descriptor for epoll")
        self._watched: dict[int, Connection] = {}

    def watch(self, connection: Connection) -> None:
        """Watch ``connection`` until :meth:`unwatch` (before its socket closes)."""
        if self._epoll is None:
            return
        fd = connection.stream.extra(anyio.abc.SocketAttribute.raw_socket).fileno()
        self._epoll.register(fd, 0)
        self._watched[fd] = connection
        connection.watched = True

    def unwatch(self, connection: Connection) -> None:
        if self._epoll is None or not connection.watched:
            return
        connection.watched = False
        fd = connection.stream.extra(anyio.abc.SocketAttribute.raw_socket).fileno()
        if self._watched.pop(fd, None) is not None:
            self._epoll.unregister(fd)

    async def serve(self) -> None:
        """Tell each watched connection when its peer hangs up, until cancelled."""
        if self._epoll is None:
            return
        while True:
            await anyio.wait_readable(self._epoll.fileno())
            for fd, _ in self._epoll.poll(0):
                connection = self._watched.pop(fd, None)
                self._epoll.unregister(fd)  # reported once: the state lasts
                if connection is not None:
                    connection.peer_hung_up()

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()


async def _hung_up(sock: socket.socket) -> None:
    """Return once the peer closed both directions (``POLLHUP``) or the socket failed.

    A half-close alone (the peer still waits for an answer) does not count
    (see :class:`HangUps`).
    """
    watch = None
    if hasattr(select, "epoll"):
        try:
            watch = select.epoll(1)
        except OSError as exc:
            if not is_shortage(exc):
                raise
    if watch is None:
        # Nothing wakes a task at a hang-up alone: ask again now and then.
        while not _hung_up_now(sock):  # noqa: ASYNC110
            await anyio.sleep(_HANG_UP_POLL_S)
        return
    with watch:
        watch.register(sock.fileno(), 0)
        await anyio.wait_readable(watch.fileno())


def _hung_up_now(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))
