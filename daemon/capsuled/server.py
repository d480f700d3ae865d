"""The Unix-socket server: listener, framing, connections, drain (docs/design.md §7, §8).

One message per line. A line longer than ``MAX_MESSAGE_BYTES`` is answered
with -32600 and the connection is closed. A final line without its ``\\n``
is still answered when the peer half-closes (``printf '...' | socat -
UNIX-CONNECT:sock`` works).

Requests on one connection are answered in order. While a connection's task
waits for its next request, a request for an immediate method (``ping``,
``status``: see :meth:`Dispatcher.answer_now`) is answered from the event
loop's callback for the readable socket, without waking the task. No failure
of one connection reaches the server: each connection task catches what it
raises (one escaping exception kills an anyio ``serve``).

A reply the peer does not read within ``write_timeout_s`` drops the
connection, so a stuck reader cannot hold a request slot forever.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import os
import select
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import structlog
from anyio.abc import ByteStream, SocketStream, TaskStatus, UNIXSocketStream

from capsule_client.protocol import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    MAX_MESSAGE_BYTES,
    ErrorCode,
)

from .jsonrpc import LATER, Dispatcher, Later, ReplyParts, encode_error

__all__ = [
    "Connection",
    "Server",
    "UnixListener",
    "current_connection",
    "fit_to_descriptors",
]

T = TypeVar("T")

#: How often a half-closed peer, waiting for a long poll's answer, is checked for a hang-up.
_HALF_CLOSED_POLL_S = 0.2


def _hung_up(sock: socket.socket) -> bool:
    """Whether the peer closed both directions (``POLLHUP``), not just its writing side."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


log = structlog.get_logger("capsuled.server")

#: The connection whose request is being handled (for methods that push
#: notifications later, such as subscriptions).
current_connection: contextvars.ContextVar[Connection] = contextvars.ContextVar(
    "current_connection"
)

_RECEIVE_CHUNK = 65536


class Connection:
    """One client connection: its stream, a send lock, and whether it is busy.

    Args:
        stream: the accepted connection.
        number: its number in the daemon's log.
        write_timeout_s: how long a reply may wait for the peer to read it.
        answer_now: gives the reply to a line without waiting, or ``LATER``
            (see :meth:`Dispatcher.answer_now`); ``None`` answers every line
            from the connection's task.
    """

    def __init__(
        self,
        stream: SocketStream,
        number: int,
        write_timeout_s: float,
        answer_now: Callable[[Connection, bytes], ReplyParts | Later | None] | None = None,
    ) -> None:
        self.stream = stream
        self.number = number
        self.busy = False
        self.scope = anyio.CancelScope()
        #: Set once the connection has ended (subscriptions end with it).
        self.closed = anyio.Event()
        self._send_lock = anyio.Lock()
        self._write_timeout_s = write_timeout_s
        self._after_reply: list[Callable[[], None]] = []
        self._raw_socket: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        #: The requests received, line by line (registered with the event loop
        #: by :meth:`Server._serve_connection` for the connection's life).
        self.lines = _LineReader(
            self._raw_socket,
            on_blind=self._reading_stopped,
            answer_now=None if answer_now is None else self._answer_now,
        )
        self._answer = answer_now
        #: The rest of a reply answered at once that the socket did not take:
        #: it goes out before anything else (see :meth:`_answer_now`).
        self._unsent: list[memoryview] | None = None
        #: A line was cut short (a send failed, or the write timeout passed):
        #: the peer may hold part of a line, so nothing more is written.
        self._cut_short = False
        self._guarded = 0  # requests in unless_peer_leaves
        self._peer_check: asyncio.TimerHandle | None = None

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
        The line reader keeps receiving while the request runs, so it sees
        end-of-stream; only then is the peer checked for a hang-up. A reader
        paused by a backlog of unread requests sees nothing, so then too the
        peer is checked. A request answered at once costs a counter, not a task.
        """
        self._guarded += 1
        if self.lines.blind:
            self._check_peer()
        try:
            return await call()
        finally:
            self._guarded -= 1
            if not self._guarded and self._peer_check is not None:
                self._peer_check.cancel()
                self._peer_check = None

    def _answer_now(self, line: bytes) -> bool:
        """Answer ``line`` from the line reader's callback, if it can be answered
        without waiting; ``False`` leaves it to the connection's task.

        The task is waiting for a line, so every earlier request was answered.
        Nothing is answered here while a line is being written (a reply or a
        notification) or the connection is ending. The reply is offered to
        the socket directly; what the socket does not take is kept, and the
        task is woken to send it, under the send lock and the write timeout,
        before anything else is written or read. A failure here ends the
        connection, as one in the task would.
        """
        try:
            return self._answer_and_send(line)
        except Exception:
            log.warning("connection failed", connection=self.number, exc_info=True)
            self._cut_short = True
            self.scope.cancel()
            return True

    def _answer_and_send(self, line: bytes) -> bool:
        if (
            self._send_lock.locked()
            or self._unsent is not None
            or self._cut_short
            or self.scope.cancel_called
        ):
            return False
        assert self._answer is not None
        reply = self._answer(self, line)
        if isinstance(reply, Later):
            return False
        if reply is not None:
            rest = self._send_now(_pending(reply))
            if rest is None:
                self.scope.cancel()  # the peer is gone: the connection ends
            elif rest:
                self._unsent = rest
                self.lines.interrupt()
        return True

    def _send_now(self, pending: list[memoryview]) -> list[memoryview] | None:
        """Offer ``pending`` to the socket once, without waiting: what it did not
        take (``[]``: all of it), or ``None`` if the socket failed (the line is
        cut short)."""
        raw = self._raw_socket
        try:
            if len(pending) == 1:
                sent = raw.send(pending[0])
                if sent == len(pending[0]):
                    return []  # the usual line: all of it sent
            else:
                sent = raw.sendmsg(pending)
            return _advance(pending, sent)
        except (BlockingIOError, InterruptedError):
            return pending
        except OSError:
            self._cut_short = True
            return None

    async def send_unsent(self) -> bool:
        """Send what the socket did not take of a reply given at once (see
        :meth:`_answer_now`), unless a sender did first; ``False`` if the peer
        is gone or stuck (then or in that sender's hands)."""
        if self._unsent is None:
            return not self._cut_short
        await self._send_lock.acquire()
        try:
            pending, self._unsent = self._unsent, None
            if self._cut_short:
                return False
            return await self._send_rest(self._raw_socket, pending) if pending else True
        finally:
            self._send_lock.release()

    def _reading_stopped(self) -> None:
        """The line reader saw end-of-stream or an error, or paused: check the peer
        if a request waits."""
        if self._guarded:
            self._check_peer()

    def _check_peer(self) -> None:
        # End of stream: the peer shut its writing side. If it only half-closed,
        # it still waits for the answer (docs/protocol.md); it is gone once the
        # socket also reports a hang-up, or the reader saw an error (a reset).
        # A paused reader would not see the end at all: the hang-up check is
        # all there is until the request ends and reading resumes.
        if self._peer_check is not None:
            self._peer_check.cancel()  # one timer per connection, never a second chain
            self._peer_check = None
        if not self._guarded:
            return
        if self.lines.failed or _hung_up(self._raw_socket):
            log.debug("peer left during a request; ending it", connection=self.number)
            self.scope.cancel()
            return
        loop = asyncio.get_running_loop()
        self._peer_check = loop.call_later(_HALF_CLOSED_POLL_S, self._check_peer)

    def end_reading(self) -> None:
        """Make the pending read see end-of-stream, so the connection ends by itself.

        Shutting the socket down for reading is gentler than cancelling the
        read: the line reader sees end-of-stream, answers nothing more, and the
        connection closes after any line already received is answered.
        """
        try:
            self._raw_socket.shutdown(socket.SHUT_RD)
        except OSError:
            self.scope.cancel()

    async def send_line(self, *parts: bytes | memoryview) -> bool:
        """Send one message (in ``parts``) and its newline; ``False`` if the peer is gone or stuck.

        Replies and notifications take the same lock, so lines never interleave.
        When nobody holds the lock, the line is first offered to the socket
        directly: a reply that fits in the socket buffer (nearly all of them)
        costs one ``send(2)`` and no lock, timer or task switch. The rest
        is sent under the lock and the write timeout. A small one-part line is
        joined with its newline; otherwise the parts are gathered by the
        kernel, never joined here: a snapshot reply of megabytes is sent from
        discovery's own encoded buffer, not from a copy.

        Once a line was cut short (a failed send, the write timeout), every
        later line is refused: the peer may hold part of a line, and another
        line would read as its end.
        """
        if self._cut_short:
            return False
        pending = _pending(parts)
        if self._send_lock.locked() or self._unsent is not None:
            await self._send_lock.acquire()
            if self._unsent is not None:  # a reply answered at once goes first
                pending, self._unsent = [*self._unsent, *pending], None
        else:
            rest = self._send_now(pending)
            if rest is None:
                return False
            if not rest:
                return True
            pending = rest
            # Taken before any await: nothing can write between the two halves.
            self._send_lock.acquire_nowait()
        try:
            if self._cut_short:  # by the sender that held the lock before
                return False
            return await self._send_rest(self._raw_socket, pending)
        finally:
            self._send_lock.release()

    async def _send_rest(self, raw: socket.socket, pending: list[memoryview]) -> bool:
        """Send ``pending`` as the socket drains, within the write timeout (lock held)."""
        with anyio.move_on_after(self._write_timeout_s) as timeout:
            try:
                while pending:
                    try:
                        pending = _advance(pending, raw.sendmsg(pending))
                    except (BlockingIOError, InterruptedError):
                        await anyio.wait_writable(raw)
            except (anyio.ClosedResourceError, OSError):
                self._cut_short = True
                return False
            return True
        self._cut_short = True
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
        """Wake a sender waiting for the socket to drain: it is about to be closed."""
        if self._raw_socket.fileno() >= 0:
            anyio.notify_closing(self._raw_socket)


_NEWLINE = memoryview(b"\n")
#: A one-part line shorter than this is joined with its newline and sent with
#: ``send(2)``: at ping sizes, ``sendmsg(2)`` of two parts cost the server a
#: fifth more CPU per request.
_JOIN_BELOW_BYTES = 64 * 1024


def _pending(parts: ReplyParts) -> list[memoryview]:
    """One line's parts and its newline, ready for ``send``/``sendmsg``."""
    if len(parts) == 1 and len(parts[0]) < _JOIN_BELOW_BYTES:
        # A small line is cheaper joined and sent with send(2) than gathered.
        return [memoryview(b"".join((parts[0], b"\n")))]
    pending = [memoryview(part) for part in parts]
    pending.append(_NEWLINE)
    return pending


def _advance(parts: list[memoryview], sent: int) -> list[memoryview]:
    """``parts`` less their first ``sent`` bytes."""
    for index, part in enumerate(parts):
        if sent < len(part):
            rest = parts[index:]
            rest[0] = part[sent:]
            return rest
        sent -= len(part)
    return []


class Interrupted(Exception):
    """:meth:`_LineReader.next_line` was interrupted (see :meth:`_LineReader.interrupt`)."""


class _LineReader:
    """The lines a connection receives, read as they arrive.

    The socket stays registered with the event loop for the connection's life
    (as asyncio's own streams keep it): each time it is readable, a callback
    receives what is there and wakes the task waiting for a line. Through
    anyio's stream, every wait added and removed the registration (two
    ``epoll_ctl`` calls) and every receive took a checkpoint, which at many
    small requests a second cost more than the requests. This is asyncio's
    event loop API: the daemon runs on anyio's asyncio backend.

    Reading pauses while more than ``_PAUSE_BYTES`` wait unread (a peer that
    sends faster than it is answered), and resumes once lines are taken down
    to ``_RESUME_BYTES``, or when no whole line is left to take. So
    that a peer pipelining requests cannot hold the event loop, the task
    yields after every ``_YIELD_EVERY`` lines it took without waiting.

    While the task waits for a line (so every earlier line was taken), lines
    that arrive are first offered to ``answer_now``, in order, up to
    ``_YIELD_EVERY`` per callback: a request answered there never wakes the
    task. The first line it declines, and every line after it, goes to the
    task, until the task waits again.

    Args:
        sock: the connection's socket (non-blocking).
        answer_now: called on the event loop with a line (at most
            ``MAX_MESSAGE_BYTES``, with or without its ``\\n``); ``True`` if
            it answered it, ``False`` to leave it to :meth:`next_line`.
        on_blind: called on the event loop when the reader stops watching
            the socket: when end-of-stream or an error is first received, at
            :meth:`stop`, and each time reading pauses (it no longer sees
            the peer leave: see :attr:`blind`).
    """

    _PAUSE_BYTES = MAX_MESSAGE_BYTES + _RECEIVE_CHUNK
    _RESUME_BYTES = _RECEIVE_CHUNK
    _YIELD_EVERY = 16

    def __init__(
        self,
        sock: socket.socket,
        *,
        on_blind: Callable[[], None] | None = None,
        answer_now: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._sock = sock
        self._on_blind = on_blind
        self._answer_now = answer_now
        self._interrupted = False
        self._buffer = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self._waiter: asyncio.Future[None] | None = None
        self._unwaited = 0  # lines taken since the task last waited
        #: End of stream or an error was received (nothing more will come).
        self.ended = False
        #: The socket failed (reset by the peer): it is gone, not half-closed.
        self.failed = False

    @property
    def blind(self) -> bool:
        """Whether the reader would not notice the peer leave: it ended, or is paused."""
        return self.ended or (self._loop is not None and not self._reading)

    @property
    def buffered(self) -> bool:
        """Whether bytes of a next request were received already."""
        return bool(self._buffer)

    def start(self) -> None:
        """Register the socket with the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._resume()

    def stop(self) -> None:
        """Unregister the socket (before it is closed); wakes a waiting task."""
        self._pause()
        self._end()

    def _resume(self) -> None:
        if not self._reading and not self.ended and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._on_readable)
            self._reading = True

    def _pause(self) -> None:
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            if self._on_blind is not None:
                self._on_blind()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(_RECEIVE_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.failed = True
            data = b""
        if not data:
            self._pause()
            self._end()
            return
        buffer = self._buffer
        if self._answer_now is not None and self._waiter is not None and not self._waiter.done():
            if not self._answer_first(data):
                return  # nothing for the task: it waits on
        else:
            buffer += data
        if len(buffer) > self._PAUSE_BYTES:
            self._pause()
            if self._on_blind is not None:
                self._on_blind()
        self._wake()

    def _answer_first(self, data: bytes) -> bool:
        """Offer the lines in ``data`` to ``answer_now`` (the task waits, so it took
        every earlier line); what is not answered is buffered for the task.

        Returns:
            Whether the task has something to take: a line, an over-long
            start of one, or an interruption.
        """
        buffer = self._buffer
        answer_now = self._answer_now
        assert answer_now is not None
        if not buffer and data.find(b"\n") == len(data) - 1:
            # One whole line and nothing before it: the usual request.
            if answer_now(data):
                return self._interrupted
            buffer += data
            return True
        buffer += data
        for _ in range(self._YIELD_EVERY):
            at = buffer.find(b"\n")
            if at < 0 or at > MAX_MESSAGE_BYTES or not answer_now(bytes(buffer[:at])):
                break
            del buffer[: at + 1]
        return self._interrupted or len(buffer) > MAX_MESSAGE_BYTES or b"\n" in buffer

    def interrupt(self) -> None:
        """Make :meth:`next_line` raise :class:`Interrupted` once: now if a task
        waits in it, else at its next call (before any line)."""
        self._interrupted = True
        self._wake()

    async def next_line(self) -> bytes | None:
        """The next line without its ``\\n``; ``None`` if it is longer than the limit.

        At end of stream, a last line without its ``\\n`` is returned.

        Raises:
            EOFError: nothing more will come (end of stream, an error, or :meth:`stop`).
            Interrupted: :meth:`interrupt` was called.
        """
        while True:
            if self._interrupted:
                self._interrupted = False
                raise Interrupted
            buffer = self._buffer
            at = buffer.find(b"\n")
            if at >= 0:
                line = bytes(buffer[:at])
                del buffer[: at + 1]  # from the front of a bytearray: no copy of the rest
                if len(buffer) <= self._RESUME_BYTES:
                    self._resume()
                self._unwaited += 1
                if self._unwaited >= self._YIELD_EVERY:
                    self._unwaited = 0
                    await anyio.lowlevel.checkpoint()
                return line
            if len(buffer) > MAX_MESSAGE_BYTES:
                buffer.clear()
                return None
            if self.ended:
                if self.failed or not buffer:
                    raise EOFError
                line = bytes(buffer)
                buffer.clear()
                return line
            assert self._loop is not None, "start() first"
            # No whole line is buffered: more must come, paused or not (the
            # start of a long line may be what is left after a burst).
            self._resume()
            self._waiter = self._loop.create_future()
            self._unwaited = 0
            try:
                await self._waiter
            finally:
                self._waiter = None


class Server:
    """Serves a :class:`Dispatcher` on a listener until told to stop.

    Args:
        dispatcher: answers each line.
        max_connections: connections served at once; one more is answered
            -32002 and closed.
        write_timeout_s: how long a reply may wait for the peer to read it.
        on_connect: called for each accepted connection with its raw socket,
            before anything is read; returning an error line (bytes) sends it
            and closes the connection (the peer-credential check uses this).
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        max_connections: int = 1024,
        write_timeout_s: float = 10.0,
        on_connect: Callable[[socket.socket], bytes | None] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.max_connections = max_connections
        self.write_timeout_s = write_timeout_s
        self.on_connect = on_connect
        self.connections: set[Connection] = set()
        self._accepted = 0
        self._accept_scope = anyio.CancelScope()
        self._connection_closed = anyio.Event()
        self._stopping = False
        self._spare_fd: int | None = None

    @property
    def clients(self) -> int:
        """Connections open now."""
        return len(self.connections)

    async def serve(
        self,
        listener: UnixListener,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections until :meth:`stop_accepting`, then wait for them to end.

        Before accepting, the connection cap is fitted to the open-file limit
        (see :func:`fit_to_descriptors`), so that the cap answers -32002 before
        ``accept`` runs out of descriptors.
        """
        self.max_connections = fit_to_descriptors(self.max_connections)
        self._spare_fd = _open_spare()
        try:
            async with anyio.create_task_group() as connections:
                async with listener:
                    task_status.started()
                    with self._accept_scope:
                        await self._accept_loop(listener, connections)
                await self.wait_closed()
        finally:
            if self._spare_fd is not None:
                os.close(self._spare_fd)
                self._spare_fd = None

    async def _accept_loop(self, listener: UnixListener, tg: anyio.abc.TaskGroup) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._refuse_one(listener):
                    continue
                # Anything else, or no spare descriptor: back off instead of spinning.
                log.warning("accept failed", error=str(exc), errno=exc.errno)
                await anyio.sleep(0.1)
                continue
            self._accepted += 1
            tg.start_soon(self._serve_connection, stream, self._accepted)

    def _refuse_one(self, listener: UnixListener) -> bool:
        """Out of descriptors: accept one waiting connection, answer -32002, close it.

        A spare descriptor is held for this moment: closing it makes room for
        the one ``accept``, so the client gets an answer instead of waiting in
        the backlog for a descriptor that may never come.
        """
        if self._spare_fd is None:
            self._spare_fd = _open_spare()
            return False
        os.close(self._spare_fd)
        self._spare_fd = None
        try:
            try:
                client, _ = listener.socket.accept()
            except OSError:
                return False
            with client:
                client.setblocking(False)
                line = encode_error(
                    ErrorCode.OVERLOADED, "overloaded: the daemon is out of file descriptors"
                )
                try:
                    client.send(line + b"\n")
                except OSError:
                    pass
            log.warning("connection refused: out of file descriptors")
            return True
        finally:
            self._spare_fd = _open_spare()

    def stop_accepting(self) -> None:
        """Close the listener; connections go on until :meth:`close_idle` or they end."""
        self._stopping = True
        self._accept_scope.cancel()

    def close_idle(self) -> None:
        """Close every connection not in the middle of a request.

        A busy connection closes itself after sending its current reply.
        """
        for connection in list(self.connections):
            if not connection.busy:
                connection.end_reading()

    async def wait_closed(self) -> None:
        """Return once no connection is open (any number of tasks may wait)."""
        while self.connections:
            await self._connection_closed.wait()

    def close_all(self) -> None:
        """Cancel every connection, busy or not (the drain timeout passed)."""
        for connection in list(self.connections):
            connection.scope.cancel()

    async def _serve_connection(self, stream: SocketStream, number: int) -> None:
        connection = Connection(stream, number, self.write_timeout_s, self._answer_now)
        self.connections.add(connection)
        try:
            with connection.scope:
                async with stream:
                    try:
                        await self._converse(connection)
                    finally:
                        connection.lines.stop()
                        connection.notify_closing()
        except Exception:
            log.warning("connection failed", connection=number, exc_info=True)
        finally:
            self.connections.discard(connection)
            connection.closed.set()
            # Wake every waiter, then arm a fresh event for the next close.
            self._connection_closed.set()
            self._connection_closed = anyio.Event()

    async def _converse(self, connection: Connection) -> None:
        stream = connection.stream
        if len(self.connections) > self.max_connections:
            log.warning("connection refused: too many", limit=self.max_connections)
            await connection.send_line(
                encode_error(
                    ErrorCode.OVERLOADED,
                    f"overloaded: more than {self.max_connections} connections",
                )
            )
            return
        if self.on_connect is not None:
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
            refusal = self.on_connect(raw) if raw is not None else None
            if refusal is not None:
                await connection.send_line(refusal)
                await _hang_up_gently(stream)
                return
        token = current_connection.set(connection)
        try:
            connection.lines.start()
            await self._read_requests(connection)
        finally:
            current_connection.reset(token)

    async def _read_requests(self, connection: Connection) -> None:
        lines = connection.lines
        while not self._stopping:
            try:
                line = await lines.next_line()
            except EOFError:
                return
            except Interrupted:
                if not await connection.send_unsent():
                    return
                continue
            final = lines.ended and not lines.buffered
            if line is None or len(line) > MAX_MESSAGE_BYTES:
                await connection.send_line(
                    encode_error(
                        INVALID_REQUEST,
                        f"invalid request: message longer than {MAX_MESSAGE_BYTES} bytes; "
                        "closing the connection",
                    )
                )
                return
            connection.busy = True
            try:
                reply = await self._answer(connection, line)
                if reply is not None and not await connection.send_line(*reply):
                    return
                connection.replied()
            finally:
                connection.busy = False
            if final:
                return

    def _answer_now(self, connection: Connection, line: bytes) -> ReplyParts | Later | None:
        """:meth:`Dispatcher.answer_now`, or ``LATER`` once the server is stopping;
        -32603 as in :meth:`_answer`."""
        if self._stopping:
            return LATER
        try:
            return self.dispatcher.answer_now(line)
        except Exception as exc:
            return self._failed(connection, line, exc)

    async def _answer(self, connection: Connection, line: bytes) -> ReplyParts | None:
        """The dispatcher's reply to ``line``; -32603 if the dispatcher itself fails.

        The dispatcher answers every input it understands, but a failure it
        did not foresee (in decoding, logging or encoding) must cost the peer
        one error reply, not its connection (docs/design.md §7: -32603, "the connection
        and the daemon live on").
        """
        try:
            return await self.dispatcher.answer_line(line)
        except Exception as exc:
            return self._failed(connection, line, exc)

    @staticmethod
    def _failed(connection: Connection, line: bytes, exc: Exception) -> ReplyParts:
        log.error(
            "request could not be answered",
            connection=connection.number,
            line_bytes=len(line),
            exc_info=True,  # called while ``exc`` is being handled
        )
        return (encode_error(INTERNAL_ERROR, f"internal error: {type(exc).__name__}"),)


#: Descriptors kept free for everything that is not a connection: the store,
#: receipts being read, the watcher, the log, the listener (at most a quarter
#: of a small limit).
DESCRIPTOR_RESERVE = 64


def fit_to_descriptors(max_connections: int) -> int:
    """The connection cap that the open-file limit can honour.

    Raises the soft ``RLIMIT_NOFILE`` to the hard limit (the daemon never uses
    ``select``, so a large limit costs nothing), then caps connections at the
    soft limit less a reserve. A smaller cap than asked is logged.

    Args:
        max_connections: the cap asked for (``--max-connections``).

    Returns:
        The cap to use, at least 1.
    """
    try:
        import resource
    except ImportError:  # not POSIX
        return max_connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, max_connections * 2)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (OSError, ValueError) as exc:  # macOS refuses more than OPEN_MAX
            log.info("could not raise the open-file limit", error=str(exc))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    reserve = min(DESCRIPTOR_RESERVE, soft // 4)
    fitted = max(1, min(max_connections, soft - reserve))
    if fitted < max_connections:
        log.warning(
            "connection cap lowered to fit the open-file limit",
            max_connections=max_connections,
            fitted=fitted,
            nofile_soft=soft,
            nofile_hard=hard,
        )
    return fitted


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


async def _hang_up_gently(
    stream: ByteStream, *, grace_s: float = 1.0, max_bytes: int = MAX_MESSAGE_BYTES
) -> None:
    """Half-close, then discard what the peer sends until it closes (bounded).

    A refused peer usually sends its request right after connecting. Closing at
    once would make that send fail (EPIPE) before the peer reads the error
    line; this way it reads the line, then end-of-stream.
    """
    with anyio.move_on_after(grace_s):
        try:
            await stream.send_eof()
            discarded = 0
            while discarded < max_bytes:
                discarded += len(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass


class UnixListener:
    """A listening Unix socket that hands out anyio streams.

    anyio's own asyncio listener (4.16) sets its accept future from a reader
    callback that can fire twice when connections arrive in a burst, which
    raises ``InvalidStateError`` inside the event loop; this accept loop
    waits with ``anyio.wait_readable``, which tolerates that.

    Args:
        sock: a bound, listening ``AF_UNIX`` stream socket (made non-blocking here).
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.socket = sock

    async def accept(self) -> UNIXSocketStream:
        """The next connection; raises ``OSError`` as ``accept(2)`` does."""
        while True:
            sock = self.socket
            try:
                client, _ = sock.accept()
            except BlockingIOError:
                try:
                    await anyio.wait_readable(sock)
                except anyio.ClosedResourceError:
                    if sock is self.socket:
                        raise
                    # replace(): go on with the new socket
                continue
            return await UNIXSocketStream.from_socket(client)

    def replace(self, sock: socket.socket) -> None:
        """Listen on ``sock`` from now on, and close the socket listened on so far.

        A connection already accepted is unaffected; one waiting in the old
        socket's backlog is lost with it (its file was gone: nobody could
        connect to it any more, see :func:`capsuled.service.mend_listening`).
        """
        sock.setblocking(False)
        old, self.socket = self.socket, sock
        anyio.notify_closing(old)
        old.close()

    async def aclose(self) -> None:
        """Stop listening (the socket file is the caller's to remove)."""
        self.socket.close()

    async def __aenter__(self) -> UnixListener:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
