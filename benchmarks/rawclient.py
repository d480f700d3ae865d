"""A minimal blocking JSON-RPC client: pre-encoded request bytes in, reply bytes out.

The benchmarks time the daemon with this rather than ``capsule_client.Client``
so that the client's own decoding is not counted; where a scenario needs the
decoded answer it decodes outside the timed region.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec

__all__ = ["RawClient", "request_line"]

_encoder = msgspec.json.Encoder()


def request_line(method: str, params: dict[str, Any] | None = None, request_id: int = 1) -> bytes:
    """One JSON-RPC 2.0 request, encoded, with its ``\\n``."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return _encoder.encode(message) + b"\n"


class RawClient:
    """One connection; one request in flight.

    Args:
        socket_path: the daemon's socket.
        timeout_s: how long one reply may take.
    """

    def __init__(self, socket_path: Path, *, timeout_s: float = 120.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(str(socket_path))
        self._buffer = bytearray(1 << 16)

    def request_view(self, line: bytes) -> memoryview:
        """Send ``line``; return the reply line (without ``\\n``) in the client's buffer.

        The reply is read into one buffer kept across requests, so that a
        megabyte reply costs the client no fresh allocation: what is timed is
        the daemon and the kernel. The view is valid until the next request.

        Raises:
            ConnectionError: the daemon closed the connection.
            TimeoutError: no reply in time.
        """
        self.sock.sendall(line)
        filled = 0
        while True:
            if filled == len(self._buffer):
                self._buffer.extend(bytes(len(self._buffer)))  # doubles; kept for later replies
            with memoryview(self._buffer) as free:
                received = self.sock.recv_into(free[filled:])
            if not received:
                raise ConnectionError("the daemon closed the connection")
            filled += received
            if self._buffer[filled - 1] == 0x0A:  # one request in flight: its reply ends here
                return memoryview(self._buffer)[: filled - 1]

    def request(self, line: bytes) -> bytes:
        """:meth:`request_view`, copied out of the buffer."""
        with self.request_view(line) as reply:
            return bytes(reply)

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """``method`` → its decoded ``result``.

        Raises:
            RuntimeError: the daemon answered an error.
        """
        reply = msgspec.json.decode(self.request(request_line(method, params)))
        if "error" in reply:
            raise RuntimeError(f"{method} failed: {reply['error']}")
        return reply["result"]

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
