"""One client connection: its lines in, its lines out (docs/design.md §7).

A connection reads its lines in a task of its own, as they arrive, and
hands them to the server one at a time, in order (:meth:`Connection.converse`).
Every line written, replies and the notifications subscriptions push, goes
through :meth:`Connection.send_line`, one line at a time, within the write
timeout. A long request is ended when its peer leaves
(:meth:`Connection.unless_peer_leaves`).
"""

from __future__ import annotations

import contextvars
import select
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar, cast

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import SocketStream, TaskGroup

from capsule_client.protocol import INVALID_REQUEST, MAX_MESSAGE_BYTES

from .jsonrpc import encode_error

__all__ = ["Connection", "LineHandler", "current_connection"]

T = TypeVar("T")

log = structlog.get_logger("capsuled.server")

#: The connection whose request is being handled (for methods that push
#: notifications later, such as subscriptions).
current_connection: contextvars.ContextVar[Connection] = contextvars.ContextVar(
    "current_connection"
)

_RECEIVE_CHUNK: Final = 65536
#: Reading pauses while more than this waits unanswered (a peer that sends
#: faster than it is answered), and resumes once no more than ``_RESUME_BYTES`` does.
_PAUSE_BYTES: Final = MAX_MESSAGE_BYTES + _RECEIVE_CHUNK
_RESUME_BYTES: Final = _RECEIVE_CHUNK
#: Lines answered one after the other without waiting before the connection
#: lets other tasks run (a peer pipelining notifications, which get no reply).
_YIELD_EVERY: Final = 16
#: A one-part line shorter than this is joined with its newline and sent at once.
_JOIN_BELOW_BYTES: Final = 64 * 1024
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
        self._tasks: TaskGroup | None = None
        #: Whether the reader would not see the peer leave: it ended, or is paused.
        self._blind = False
        self._guarded = 0  # requests in unless_peer_leaves
        self._hang_up_watch: anyio.CancelScope | None = None

    async def converse(self, answer: LineHandler) -> None:
        """Read lines as they arrive and give them to ``answer`` one at a time, in order.

        Ends at end-of-stream (after a last line without its ``\\n``), when
        ``answer`` returns ``False``, or after answering a line longer than
        ``MAX_MESSAGE_BYTES`` with -32600. Reading goes on while a line is
        answered, so that the peer is seen leaving (see :meth:`unless_peer_leaves`).
        """
        inbox = _Inbox()
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            tasks.start_soon(self._receive, inbox)
            try:
                await self._answer(inbox, answer)
            finally:
                self._tasks = None
                tasks.cancel_scope.cancel()

    async def _answer(self, inbox: _Inbox, answer: LineHandler) -> None:
        while True:
            line = await inbox.take()
            if line is _END:
                return
            if line is None:
                await self.send_line(
                    encode_error(
                        INVALID_REQUEST,
                        f"invalid request: message longer than {MAX_MESSAGE_BYTES} bytes; "
                        "closing the connection",
                    )
                )
                return
            if not await answer(cast(bytes, line)):
                return

    async def _receive(self, inbox: _Inbox) -> None:
        """Queue each line received (``None`` for one too long, which ends reading)."""
        buffer = bytearray()
        searched = 0  # bytes of ``buffer`` known to hold no newline
        try:
            while True:
                if inbox.full:
                    self._stopped_watching()  # paused: the peer may leave unseen
                    await inbox.room()
                    self._blind = False
                try:
                    data = await self.stream.receive(_RECEIVE_CHUNK)
                except anyio.EndOfStream:
                    if buffer:
                        inbox.put(bytes(buffer))  # a last line without its newline
                    return
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # reset: gone, not half-closed; no last line
                buffer += data
                start = 0
                while (at := buffer.find(b"\n", max(start, searched))) >= 0:
                    if at - start > MAX_MESSAGE_BYTES:
                        inbox.put(None)
                        return
                    inbox.put(bytes(buffer[start:at]))
                    start = at + 1
                del buffer[:start]  # from the front of a bytearray: no copy of the rest
                searched = len(buffer)
                if searched > MAX_MESSAGE_BYTES:
                    inbox.put(None)
                    return
        finally:
            inbox.end()
            self._stopped_watching()

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
        """Await ``call()``; if the peer closes its end meanwhile, end the connection.

        A long poll may wait up to an hour for a change: a client that gave up
        must not keep its connection slot (and the poll) alive that long.
        The reader keeps receiving while the request runs, so it sees
        end-of-stream; a half-closed peer still waits for its answer
        (docs/protocol.md), so from then on (or from when reading paused for
        a backlog of unanswered requests) the socket is watched for the
        peer's hang-up, which ends the connection.
        """
        self._guarded += 1
        if self._blind:
            self._watch_for_hang_up()
        try:
            return await call()
        finally:
            self._guarded -= 1
            if not self._guarded and self._hang_up_watch is not None:
                self._hang_up_watch.cancel()
                self._hang_up_watch = None

    def _stopped_watching(self) -> None:
        """The reader saw end-of-stream or an error, or paused."""
        self._blind = True
        if self._guarded:
            self._watch_for_hang_up()

    def _watch_for_hang_up(self) -> None:
        if self._hang_up_watch is None and self._tasks is not None:
            self._hang_up_watch = anyio.CancelScope()
            self._tasks.start_soon(self._end_at_hang_up, self._hang_up_watch)

    async def _end_at_hang_up(self, watch: anyio.CancelScope) -> None:
        with watch:
            await _hung_up(self._raw_socket)
            log.debug("peer left during a request; ending it", connection=self.number)
            self.scope.cancel()

    def end_reading(self) -> None:
        """Make the pending read see end-of-stream, so the connection ends by itself.

        Shutting the socket down for reading is gentler than cancelling the
        read: the reader sees end-of-stream, and the connection closes after
        any line already received is answered.
        """
        try:
            self._raw_socket.shutdown(socket.SHUT_RD)
        except OSError:
            self.scope.cancel()

    async def send_line(self, *parts: bytes | memoryview) -> bool:
        """Send one message (in ``parts``) and its newline; ``False`` if the peer is gone or stuck.

        Replies and notifications take the same lock, so lines never
        interleave. A small one-part line is joined with its newline; larger
        parts are sent from their own buffers, never joined: a snapshot reply
        of megabytes goes out from discovery's encoded buffer, not a copy.
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
                    if len(parts) == 1 and len(parts[0]) < _JOIN_BELOW_BYTES:
                        await self.stream.send(b"".join((parts[0], b"\n")))
                    else:
                        for part in parts:
                            # The socket stream sends any buffer, a memoryview too.
                            await self.stream.send(cast(bytes, part))
                        await self.stream.send(b"\n")
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


class _End:
    """The type of :data:`_END`."""


#: :meth:`_Inbox.take` once the reader has ended and every line was taken.
_END: Final = _End()


class _Inbox:
    """The lines a connection received and has not answered yet, in order.

    ``None`` stands for a line longer than the limit. The reader waits for
    room (:meth:`room`) while more than ``_PAUSE_BYTES`` wait.
    """

    def __init__(self) -> None:
        self._lines: deque[bytes | None] = deque()
        self._bytes = 0
        self._ended = False
        self._arrived = anyio.Event()
        self._room: anyio.Event | None = None
        self._unwaited = 0  # lines taken since the taker last waited

    @property
    def full(self) -> bool:
        """Whether the reader should wait for room before receiving more."""
        return self._bytes > _PAUSE_BYTES

    def put(self, line: bytes | None) -> None:
        self._lines.append(line)
        self._bytes += 0 if line is None else len(line)
        self._arrived.set()

    def end(self) -> None:
        """Nothing more will be put."""
        self._ended = True
        self._arrived.set()

    async def room(self) -> None:
        """Return once the lines waiting are down to ``_RESUME_BYTES``."""
        self._room = anyio.Event()
        await self._room.wait()

    async def take(self) -> bytes | _End | None:
        """The next line, waiting for one; :data:`_END` once there are no more."""
        if not self._lines:
            self._unwaited = 0
            while not self._lines:
                if self._ended:
                    return _END
                self._arrived = anyio.Event()
                await self._arrived.wait()
        else:
            self._unwaited += 1
            if self._unwaited >= _YIELD_EVERY:
                self._unwaited = 0
                await anyio.lowlevel.checkpoint()
        line = self._lines.popleft()
        self._bytes -= 0 if line is None else len(line)
        if self._room is not None and self._bytes <= _RESUME_BYTES:
            self._room.set()
            self._room = None
        return line


async def _hung_up(sock: socket.socket) -> None:
    """Return once the peer closed both directions (``POLLHUP``) or the socket failed.

    A half-close alone (the peer still waits for an answer) does not count.
    With epoll, the socket is registered with no events: the hang-up and the
    error, which epoll always reports, make the epoll descriptor readable.
    """
    if not hasattr(select, "epoll"):
        # Nothing wakes a task at a hang-up alone: ask again now and then.
        while not _hung_up_now(sock):  # noqa: ASYNC110
            await anyio.sleep(_HANG_UP_POLL_S)
        return
    with select.epoll(1) as watch:
        watch.register(sock.fileno(), 0)
        await anyio.wait_readable(watch.fileno())


def _hung_up_now(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))
