"""Commands: answers whose processes carry their argv (``commands: true``, docs/design.md §5).

The argv comes from :class:`~capsuled.processes.argv.ArgvCache`: from memory when every
listed process was checked within :data:`~capsuled.processes.argv.RECHECK_S`, else read
in a worker thread, never on the event loop. An answer with commands is a
copy; the published answer (and its encoding, ``capsuled.discovery.encoded_answer``) is never
touched, so an answer without commands costs what it cost before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import anyio.to_thread
import msgspec

from capsule_client.wire import ActiveSessionsSnapshot, SessionProcess

from .argv import Argv, ArgvCache, Key
from .terminate import Target

__all__ = ["read_argv", "with_commands", "with_target_commands"]


async def read_argv(
    cache: ArgvCache,
    keys: Sequence[Key],
    *,
    fresh: bool = False,
    prune: bool = False,
    ticks: Mapping[int, int] | None = None,
) -> dict[Key, Argv]:
    """``cache.read(keys)``: from memory where it can, else in a worker thread."""
    if not fresh:
        found = cache.cached(keys)
        if found is not None:
            return found
    return await anyio.to_thread.run_sync(
        lambda: cache.read(keys, fresh=fresh, prune=prune, ticks=ticks), abandon_on_cancel=True
    )


def listed(answer: ActiveSessionsSnapshot) -> list[SessionProcess]:
    """Every process ``answer`` lists: the sessions' and the unowned ones."""
    return [*(p for s in answer.sessions for p in s.processes), *answer.unowned]


async def with_commands(
    answer: ActiveSessionsSnapshot, cache: ArgvCache, *, fresh: bool = False
) -> ActiveSessionsSnapshot:
    """A copy of ``answer`` whose every process carries ``command`` (argv or None).

    ``fresh`` checks every process for an ``exec`` now (read-your-writes asks it).
    """
    processes = listed(answer)
    if not processes:
        return answer
    argv = await read_argv(
        cache,
        [(p.pid, p.started_at) for p in processes],
        fresh=fresh,
        prune=True,
        ticks=cache.ticks_at(answer.observed_at),
    )

    def named(process: SessionProcess) -> SessionProcess:
        return msgspec.structs.replace(process, command=argv.get((process.pid, process.started_at)))

    return msgspec.structs.replace(
        answer,
        sessions=[
            msgspec.structs.replace(s, processes=[named(p) for p in s.processes])
            for s in answer.sessions
        ],
        unowned=[named(p) for p in answer.unowned],
    )


async def with_target_commands(targets: Iterable[Target], cache: ArgvCache) -> list[Target]:
    """``targets``, each with its ``command`` (read before it is signalled)."""
    targets = list(targets)
    if not targets:
        return targets
    ticks = {t.pid: t.start_ticks for t in targets if t.start_ticks is not None}
    argv = await read_argv(cache, [(t.pid, t.started_at) for t in targets], ticks=ticks)
    return [dataclasses.replace(t, command=argv.get((t.pid, t.started_at))) for t in targets]
