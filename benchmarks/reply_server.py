"""The transfer floor's server: one pre-built reply to every request line, on a Unix socket.

No parsing, no encoding, no event loop: the reply's bytes are read from a
file once, and each request line is answered with one blocking
``sendall`` of them. What remains is what moving that many bytes from one
Python process to another costs. Connections are served one at a time.
``python -m benchmarks.reply_server SOCKET REPLY`` serves until it is killed.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

__all__ = ["main", "serve"]

_READ_BYTES = 1 << 16


def _answer(connection: socket.socket, reply: bytes) -> None:
    pending = b""
    while chunk := connection.recv(_READ_BYTES):
        pending += chunk
        lines = pending.count(b"\n")
        pending = pending[pending.rfind(b"\n") + 1 :] if lines else pending
        for _ in range(lines):
            connection.sendall(reply)


def serve(socket_path: str, reply: bytes) -> None:
    """Answer every line on ``socket_path`` with ``reply`` (it ends in ``\\n``) until killed."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(socket_path)
        server.listen()
        while True:
            connection, _ = server.accept()
            with connection:
                try:
                    _answer(connection, reply)
                except ConnectionError:
                    pass


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.reply_server SOCKET REPLY``: REPLY is a file of one line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m benchmarks.reply_server SOCKET REPLY", file=sys.stderr)
        return 2
    reply = Path(args[1]).read_bytes()
    if not reply.endswith(b"\n") or reply.count(b"\n") != 1:
        print(f"{args[1]} must hold exactly one line, ending in \\n", file=sys.stderr)
        return 2
    serve(args[0], reply)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
