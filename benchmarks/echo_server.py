"""The baseline server: bare asyncio, NDJSON over a Unix socket, each line echoed.

No parsing, no dispatch, no logging: what Python's asyncio streams cost for
one line in and one line out. ``python -m benchmarks.echo_server SOCKET``
serves until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

__all__ = ["main", "serve"]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def serve(socket_path: str) -> None:
    """Echo every line on ``socket_path`` until cancelled."""
    server = await asyncio.start_unix_server(_echo, socket_path)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.echo_server SOCKET``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.echo_server SOCKET", file=sys.stderr)
        return 2
    asyncio.run(serve(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
