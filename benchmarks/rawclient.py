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

    def request(self, line: bytes) -> bytes:
        """Send ``line``; return the reply line (without ``\\n``).

        Raises:
            ConnectionError: the daemon closed the connection.
            TimeoutError: no reply in time.
        """
        self.sock.sendall(line)
        chunks: list[bytes] = []
        while True:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                return b"".join(chunks)[:-1]

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
