"""Usage: a snapshot whose processes carry their CPU share and resident memory (``usage: true``).

Measured for one request, in a worker thread, by :class:`UsageMeter`
(docs/design.md §7); each session carries its processes' figures added up
(``Session.usage``, docs/design.md §13).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import anyio
import msgspec
import psutil

from capsule_client.wire import ActiveSessionsSnapshot, Session, SessionProcess, SessionUsage

__all__ = ["UsageMeter", "with_usage"]


class UsageMeter:
    """CPU and memory of listed processes, measured with psutil (``usage: true``).

    ``cpu_percent`` is the CPU time used since this meter last measured the
    same process, over the wall time between (100 = one core busy), as
    ``psutil.Process.cpu_percent(interval=None)`` computes it; the first
    measurement of a process is 0.0. ``Process`` objects are kept per
    (pid, start time), so a reused pid starts afresh, and only for processes
    measured in the latest call, so the meter does not grow.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: dict[tuple[int, int], psutil.Process] = {}

    def measure(self, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], tuple[float, int]]:
        """``(pid, started_at)`` → ``(cpu_percent, rss_bytes)`` for those still running.

        Blocking (psutil reads ``/proc``); run it in a worker thread.
        """
        with self._lock:
            kept: dict[tuple[int, int], psutil.Process] = {}
            usage: dict[tuple[int, int], tuple[float, int]] = {}
            for key in keys:
                process = self._processes.get(key)
                try:
                    if process is None:
                        process = psutil.Process(key[0])
                    with process.oneshot():
                        cpu = process.cpu_percent(interval=None)
                        rss = process.memory_info().rss
                except psutil.Error:
                    continue
                kept[key] = process
                usage[key] = (round(cpu, 1), rss)
            self._processes = kept
            return usage


async def with_usage(answer: ActiveSessionsSnapshot, meter: UsageMeter) -> ActiveSessionsSnapshot:
    """A copy of ``answer`` whose processes carry ``cpu_percent`` and ``rss_bytes``, and
    whose sessions carry their totals (``usage``).

    A process the meter cannot find (gone, or reused) is listed as it was and
    left out of its session's totals.
    """
    processes = [*(p for s in answer.sessions for p in s.processes), *answer.unowned]
    keys = {(p.pid, p.started_at) for p in processes}
    usage = await anyio.to_thread.run_sync(meter.measure, keys)

    def measured(process: SessionProcess) -> SessionProcess:
        found = usage.get((process.pid, process.started_at))
        if found is None:
            return process
        return msgspec.structs.replace(process, cpu_percent=found[0], rss_bytes=found[1])

    return msgspec.structs.replace(
        answer,
        sessions=[_totalled(s, [measured(p) for p in s.processes]) for s in answer.sessions],
        unowned=[measured(p) for p in answer.unowned],
    )


def _totalled(session: Session, processes: list[SessionProcess]) -> Session:
    """``session`` listing ``processes``, with the totals of those that were measured.

    RSS is summed per process: a page two processes share counts once for
    each (docs/design.md §13).
    """
    cpu = 0.0
    rss = count = 0
    for process in processes:
        if isinstance(process.cpu_percent, float) and isinstance(process.rss_bytes, int):
            cpu += process.cpu_percent
            rss += process.rss_bytes
            count += 1
    usage = SessionUsage(cpu_percent=round(cpu, 1), rss_bytes=rss, processes=count)
    return msgspec.structs.replace(session, processes=processes, usage=usage)
