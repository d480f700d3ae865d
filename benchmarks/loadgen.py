"""A closed-loop NDJSON load generator: N connections, one request in flight each.

Run as its own process (``python -m benchmarks.loadgen``) so that the client's
CPU cost is the same whichever server it talks to, and does not share the
server's interpreter. It uses one thread and ``epoll`` (``selectors``), sends
pre-encoded request bytes, and counts a reply when its ``\\n`` arrives: about
as cheap as a Python client gets. It prints one JSON object on stdout::

    {"requests": int, "elapsed_s": float, "p50_s": float, "p99_s": float, "total": int}

``total`` counts every reply, warm-up and drain included.

Replies during the warm-up are not counted; requests still in flight at the
end are answered but not counted.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import time
from dataclasses import dataclass, field

from benchmarks.stats import percentile

__all__ = ["LoadResult", "main", "run_load"]


@dataclass
class _Conn:
    sock: socket.socket
    sent_at: float = 0.0
    buffer: bytearray = field(default_factory=bytearray)
    checked: bool = False


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Requests answered in the measured window, and their latency."""

    requests: int
    elapsed_s: float
    p50_s: float
    p99_s: float
    total: int

    @property
    def per_s(self) -> float:
        """Requests answered per second."""
        return self.requests / self.elapsed_s


def _connect(socket_path: str, clients: int) -> list[_Conn]:
    conns = []
    for _ in range(clients):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(socket_path)
        sock.setblocking(False)
        conns.append(_Conn(sock))
    return conns


def _check_reply(conn: _Conn, reply: bytes, expect: bytes) -> None:
    if not conn.checked:
        if expect not in reply:
            raise RuntimeError(f"unexpected reply {reply[:200]!r}, wanted {expect!r} in it")
        conn.checked = True


def run_load(
    socket_path: str,
    request: bytes,
    *,
    clients: int,
    warmup_s: float,
    duration_s: float,
    expect: bytes,
) -> LoadResult:
    """Keep ``clients`` connections busy for ``warmup_s + duration_s`` seconds.

    Args:
        socket_path: the server's Unix socket.
        request: one message, ending in ``\\n``.
        clients: concurrent connections.
        warmup_s: seconds before counting starts.
        duration_s: seconds counted.
        expect: bytes the first reply on each connection must contain.

    Raises:
        RuntimeError: a reply did not contain ``expect``, or a server hung up.
    """
    clock = time.perf_counter
    conns = _connect(socket_path, clients)
    selector = selectors.DefaultSelector()
    now = clock()
    for conn in conns:
        selector.register(conn.sock, selectors.EVENT_READ, conn)
        conn.sent_at = now
        conn.sock.send(request)
    measure_from = now + warmup_s
    measure_until = measure_from + duration_s
    latencies: list[float] = []
    total = 0
    sending = True
    in_flight = clients
    while in_flight:
        for key, _ in selector.select(timeout=10.0):
            conn = key.data
            chunk = conn.sock.recv(65536)
            if not chunk:
                raise RuntimeError("the server closed a connection")
            conn.buffer += chunk
            end = conn.buffer.find(b"\n")
            if end < 0:
                continue
            _check_reply(conn, bytes(conn.buffer[:end]), expect)
            del conn.buffer[: end + 1]
            total += 1
            now = clock()
            if measure_from <= conn.sent_at and now <= measure_until:
                latencies.append(now - conn.sent_at)
            if now >= measure_until:
                sending = False
            if sending:
                conn.sent_at = now
                conn.sock.send(request)
            else:
                in_flight -= 1
    for conn in conns:
        selector.unregister(conn.sock)
        conn.sock.close()
    if not latencies:
        raise RuntimeError("no request was answered in the measured window")
    return LoadResult(
        requests=len(latencies),
        elapsed_s=duration_s,
        p50_s=percentile(latencies, 50),
        p99_s=percentile(latencies, 99),
        total=total,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.loadgen SOCKET --clients N ...``; prints the result as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("socket")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--warmup-s", type=float, default=0.5)
    parser.add_argument("--duration-s", type=float, default=2.0)
    parser.add_argument("--request", default='{"jsonrpc":"2.0","id":1,"method":"ping"}')
    parser.add_argument("--expect", default='"pong":true')
    args = parser.parse_args(argv)
    result = run_load(
        args.socket,
        args.request.encode() + b"\n",
        clients=args.clients,
        warmup_s=args.warmup_s,
        duration_s=args.duration_s,
        expect=args.expect.encode(),
    )
    print(
        json.dumps(
            {
                "requests": result.requests,
                "elapsed_s": result.elapsed_s,
                "p50_s": result.p50_s,
                "p99_s": result.p99_s,
                "total": result.total,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
