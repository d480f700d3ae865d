"""Usage: a snapshot whose processes carry their CPU share and resident memory (``usage: true``).

Measured for one request, in a worker thread, by
:class:`~capsuled.processes.sample.UsageMeter` (docs/design.md §7).
"""

from __future__ import annotations

import anyio
import msgspec

from capsule_client.wire import ActiveSessionsSnapshot, SessionProcess

from .sample import UsageMeter

__all__ = ["with_usage"]


async def with_usage(answer: ActiveSessionsSnapshot, meter: UsageMeter) -> ActiveSessionsSnapshot:
    """A copy of ``answer`` whose processes carry ``cpu_percent`` and ``rss_bytes``.

    A process the meter cannot find (gone, or reused) is listed as it was.
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
        sessions=[
            msgspec.structs.replace(s, processes=[measured(p) for p in s.processes])
            for s in answer.sessions
        ],
        unowned=[measured(p) for p in answer.unowned],
    )
