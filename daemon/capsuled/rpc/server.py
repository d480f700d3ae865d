"""The Unix-socket server: listener, connections, drain (docs/design.md §7, §8).

One message per line (the framing is :class:`~capsuled.rpc.connection.Connection`'s).
Requests on one connection are answered in order, each reply sent whole
before the next line is answered. No failure of one connection reaches the
server: each connection task catches what it raises (one escaping exception
kills an anyio ``serve``).

A reply the peer does not read within ``write_timeout_s`` drops the
connection, so a stuck reader cannot hold a request slot forever.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
from collections.abc import Callable
from typing import Final

import anyio
import structlog
from anyio.abc import ByteStream, SocketStream, TaskGroup, TaskStatus, UNIXSocketStream

from capsule_client.wire import INTERNAL_ERROR, MAX_MESSAGE_BYTES, ErrorCode
from capsuled.common.shortage import is_shortage

from .connection import Connection, HangUps, current_connection
from .jsonrpc import Dispatcher, ReplyParts, encode_error

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_WRITE_TIMEOUT_S",
    "Connection",
    "Server",
    "UnixListener",
    "current_connection",
]

log = structlog.get_logger("capsuled.server")

#: Connections served at once, and how long a reply may wait for its peer, seconds,
#: unless configured otherwise (``--max-connections``, ``--write-timeout``).
DEFAULT_MAX_CONNECTIONS: Final = 1024
DEFAULT_WRITE_TIMEOUT_S: Final = 10.0
#: Connections past the cap being refused at once (docs/design.md §8).
MAX_REFUSING: Final = 4

#: Seconds between two tries of an ``accept`` that failed.
_ACCEPT_RETRY_S: Final = 0.1


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
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
        on_connect: Callable[[socket.socket], bytes | None] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.max_connections = max_connections
        self.write_timeout_s = write_timeout_s
        self.on_connect = on_connect
        self.connections: set[Connection] = set()
        self._accepted = 0
        self._admitted = 0  # connections accepted and not yet closed
        self._refusals = anyio.Semaphore(MAX_REFUSING)  # refusals past the cap under way
        self._accept_scope = anyio.CancelScope()
        self._connection_closed = anyio.Event()
        self._accepting = True
        self._spare_fd: int | None = None
        self._hang_ups: HangUps | None = None

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

        The cap is the connections' share of the open-file limit
        (:mod:`capsuled.service.budget`), so the cap answers -32002 before ``accept``
        runs out of descriptors; a spare descriptor is kept for when it does.
        """
        self._spare_fd = _open_spare()
        self._hang_ups = HangUps()
        try:
            async with anyio.create_task_group() as connections:
                connections.start_soon(self._hang_ups.serve)
                async with listener:
                    task_status.started()
                    with self._accept_scope:
                        await self._accept_loop(listener, connections)
                await self.wait_closed()
                connections.cancel_scope.cancel()  # the hang-up watch
        finally:
            self._hang_ups.close()
            self._hang_ups = None
            if self._spare_fd is not None:
                os.close(self._spare_fd)
                self._spare_fd = None

    async def _accept_loop(self, listener: UnixListener, tg: TaskGroup) -> None:
        failing = False  # logged once per run of failures, not at every retry
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if is_shortage(exc) and self._refuse_one(listener):
                    continue
                # Anything else, or no spare descriptor: back off instead of spinning.
                if not failing:
                    log.warning("accept failed; retrying", error=str(exc), errno=exc.errno)
                failing = True
                await anyio.sleep(_ACCEPT_RETRY_S)
                if is_shortage(exc):  # accept(2) fails so even with nobody waiting
                    with contextlib.suppress(anyio.ClosedResourceError):  # replaced
                        await anyio.wait_readable(listener.socket)
                continue
            if failing:
                log.info("accepting again")
                failing = False
            if self._at_cap():
                await self._refusals.acquire()  # at most a few at once: the rest wait
                tg.start_soon(self._refuse_over_cap, stream)
                continue
            self._admitted += 1
            self._accepted += 1
            tg.start_soon(self._serve_connection, stream, self._accepted)

    def _at_cap(self) -> bool:
        """Whether one more connection would pass the cap.

        A connection whose peer has hung up is about to close (its task has not
        run yet): it is not counted, so a client that connects the moment
        another left is served, not refused. Asked with one ``poll`` (no
        descriptor), only at the cap.
        """
        if self._admitted < self.max_connections:
            return False
        poller = select.poll()
        closed = 0  # closed already, its task not ended yet
        for connection in self.connections:
            raw = connection.stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
            fd = -1 if raw is None else raw.fileno()
            if fd < 0:
                closed += 1
            else:
                poller.register(fd, 0)  # hang-ups and errors are always reported
        return self._admitted - closed - len(poller.poll(0)) >= self.max_connections

    async def _refuse_over_cap(self, stream: UNIXSocketStream) -> None:
        """One connection past the cap: one -32002 line, then closed gently.

        At most :data:`MAX_REFUSING` are refused at once, and the accept loop
        waits for one of them to end before it accepts again: a burst of
        clients past the cap holds a few descriptors, never the shares of
        the others (docs/design.md §8). Each is half-closed and what the peer
        sends is read until it closes (bounded, as for a refused peer): a Unix
        socket closed with unread data resets its peer before it reads the line.
        """
        try:
            log.warning("connection refused: too many", limit=self.max_connections)
            line = encode_error(
                ErrorCode.OVERLOADED, f"overloaded: more than {self.max_connections} connections"
            )
            async with stream:
                try:
                    await stream.send(line + b"\n")
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return
                await _hang_up_gently(stream)
        finally:
            self._refusals.release()

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
        self._accepting = False
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
        connection = Connection(stream, number, self.write_timeout_s)
        self.connections.add(connection)
        try:
            with connection.scope:
                async with stream:
                    if self._hang_ups is not None:
                        self._hang_ups.watch(connection)
                    try:
                        await self._converse(connection)
                    finally:
                        if self._hang_ups is not None:
                            self._hang_ups.unwatch(connection)
                        connection.discard_unread()
        except Exception:
            log.warning("connection failed", connection=number, exc_info=True)
        finally:
            self._admitted -= 1
            self.connections.discard(connection)
            connection.closed.set()
            # Wake every waiter, then arm a fresh event for the next close.
            self._connection_closed.set()
            self._connection_closed = anyio.Event()

    async def _converse(self, connection: Connection) -> None:
        stream = connection.stream
        if self.on_connect is not None:
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
            refusal = self.on_connect(raw) if raw is not None else None
            if refusal is not None:
                await connection.send_line(refusal)
                await _hang_up_gently(stream)
                return
        token = current_connection.set(connection)
        try:
            await connection.converse(lambda line: self._handle(connection, line))
        finally:
            current_connection.reset(token)

    async def _handle(self, connection: Connection, line: bytes) -> bool:
        """Answer one line and send the reply; whether the connection goes on."""
        if not self._accepting:
            return False
        connection.busy = True
        try:
            reply = await self._answer(connection, line)
            if reply is not None and not await connection.send_line(*reply):
                return False
            connection.replied()
            return self._accepting  # a busy connection closes after its reply
        finally:
            connection.busy = False

    async def _answer(self, connection: Connection, line: bytes) -> ReplyParts | None:
        """The dispatcher's reply to ``line``; -32603 if the dispatcher itself fails.

        The dispatcher answers every input it understands, but a failure it
        did not foresee (in decoding, logging or encoding) must cost the peer
        one error reply, not its connection (docs/design.md §7: -32603, "the connection
        and the daemon live on").
        """
        try:
            return await self.dispatcher.answer(line)
        except Exception as exc:
            log.error(
                "request could not be answered",
                connection=connection.number,
                line_bytes=len(line),
                exc_info=True,
            )
            return (encode_error(INTERNAL_ERROR, f"internal error: {type(exc).__name__}"),)


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
        connect to it any more, see :func:`capsuled.rpc.sockets.mend_listening`).
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
