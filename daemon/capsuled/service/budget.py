"""The descriptor budget: the open-file limit raised at start and shared out (docs/design.md §8).

A budget, not a race. At start the soft ``RLIMIT_NOFILE`` is raised to the
hard limit (as systemd services do; the daemon never uses ``select``), and
what is free is shared in this order:

1. the daemon's own: the watch, the store, an observation's opens (a
   directory per level being walked, a receipt, ``/proc``), a reconcile's
   trace, the metrics textfile, the spare descriptor the server keeps to
   refuse a connection with a line: a quarter of what is free, at least
   :data:`OWN_MIN`, at most :data:`OWN_MAX`;
2. pidfds: half of the rest at most (less when fewer are asked, see
   below), split between the exit watch (``--max-pidfds``) and the
   descendants tracker; past their share, those processes are sampled;
3. client connections (``--max-connections``): the rest, at least one;
   one more is answered -32002 and closed.

A share that is asked for less gives the remainder to the other: with
``--max-connections 16`` the pidfds may have all but 16.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

import structlog

from capsuled.processes.descendants import MAX_TRACKED_PIDFDS

__all__ = ["OWN_MAX", "OWN_MIN", "Budget", "open_descriptors", "raise_nofile", "share"]

log = structlog.get_logger("capsuled.budget")

#: Bounds on the descriptors kept for the daemon's own work (the first share).
OWN_MIN: Final = 16
OWN_MAX: Final = 64


@dataclass(frozen=True, slots=True)
class Budget:
    """How the open-file limit is shared out.

    Attributes:
        limit: the soft ``RLIMIT_NOFILE`` after raising it; None when unlimited
            or not POSIX (then the shares are what was asked).
        in_use: descriptors open when the budget was made.
        own: kept for the daemon's own work.
        exit_pidfds: the exit watch's pidfds at most.
        descendant_pidfds: the descendants tracker's pidfds at most.
        connections: connections served at once.
    """

    limit: int | None
    in_use: int
    own: int
    exit_pidfds: int
    descendant_pidfds: int
    connections: int


def raise_nofile() -> int | None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; the soft limit after (None: unlimited).

    A refusal (macOS caps it at ``OPEN_MAX``) is logged and the limit kept.
    """
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:
            log.info("could not raise the open-file limit", error=str(exc), soft=soft, hard=hard)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def open_descriptors() -> int:
    """Descriptors this process holds now (``/proc/self/fd`` or ``/dev/fd``); 0 if unknown."""
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(len(os.listdir(directory)) - 1, 0)  # less the listing's own
        except OSError:
            continue
    return 0


def share(max_pidfds: int, max_connections: int, *, limit: int | None = None) -> Budget:
    """Share the open-file limit out (see the module's docstring).

    Args:
        max_pidfds: the exit watch's pidfds asked (``--max-pidfds``).
        max_connections: the connections asked (``--max-connections``).
        limit: the soft limit to share; by default :func:`raise_nofile`'s.

    Returns:
        The budget; a share lower than asked is logged at warning.
    """
    limit = raise_nofile() if limit is None else limit
    in_use = open_descriptors()
    wanted_pidfds = max_pidfds + MAX_TRACKED_PIDFDS
    if limit is None:
        return Budget(None, in_use, 0, max_pidfds, MAX_TRACKED_PIDFDS, max_connections)
    free = max(limit - in_use, 0)
    own = max(OWN_MIN, min(OWN_MAX, free // 4))
    rest = max(free - own, 0)
    pidfds = min(wanted_pidfds, max(rest // 2, rest - max_connections))
    connections = max(1, min(max_connections, rest - pidfds))
    exit_pidfds = min(max_pidfds, max(pidfds // 2, pidfds - MAX_TRACKED_PIDFDS))
    budget = Budget(
        limit=limit,
        in_use=in_use,
        own=own,
        exit_pidfds=exit_pidfds,
        descendant_pidfds=min(MAX_TRACKED_PIDFDS, pidfds - exit_pidfds),
        connections=connections,
    )
    if exit_pidfds < max_pidfds or connections < max_connections:
        log.warning(
            "the open-file limit is shared out below what was asked",
            nofile=limit,
            in_use=in_use,
            own=own,
            max_pidfds=max_pidfds,
            exit_pidfds=budget.exit_pidfds,
            descendant_pidfds=budget.descendant_pidfds,
            max_connections=max_connections,
            connections=connections,
        )
    return budget
