"""Generations: answers numbered, one more each time the answer differs (docs/design.md §7).

The number also tells "the answer did not change": two settled answers (not
``scanning``) with the same generation have equal ``sessions``, ``unowned``,
``servers``, ``discovery`` and ``gaps``, so whatever was derived from one
(its encoded bytes) serves the other.
"""

from __future__ import annotations

import threading
import time

import msgspec

from capsule_client.wire import ActiveSessionsSnapshot

__all__ = ["Generations", "run_base", "same_answer"]


def run_base() -> int:
    """Where a run of the daemon starts counting generations: microseconds since the epoch.

    A later run starts above any number an earlier run reached, unless that
    run saw more than one change per microsecond of its life or the clock
    was set back by more than the time between the two starts. The numbers
    stay below 2**53, so JSON clients that read them as doubles keep them
    exact (until the year 2255).
    """
    return time.time_ns() // 1000


class Generations:
    """Numbers successive answers: one more each time the answer differs (docs/design.md §7).

    The answer is ``sessions``, ``unowned``, ``servers``, ``discovery`` and
    ``gaps``; ``observed_at``, ``task`` and ``cost`` do not count. Kept apart
    from the reader so that a fresh reader (after the home was replaced)
    continues the count.

    A ``scanning`` answer is not counted: it says "read again" (ownership
    moved during the observation, or a rescan arrived meanwhile), the daemon
    retries it at once, and it carries the generation of the last settled
    answer. Counting it would move the generation twice across a write that
    changed nothing (``scanning``, then the same ``ready`` answer again), and
    long polls and subscriptions would wake for nothing.

    Args:
        base: the count before the first answer (which gets ``base + 1``).
            The daemon starts each run above the previous runs' numbers
            (:func:`run_base`), so that a generation a client kept from an
            earlier run never names an answer of this one.
    """

    def __init__(self, base: int = 0) -> None:
        self._lock = threading.Lock()
        self._generation = base
        self._previous: tuple[object, ...] | None = None

    @property
    def current(self) -> int:
        """The generation of the latest answer stamped; ``base`` before the first."""
        with self._lock:
            return self._generation

    def stamp(self, snapshot: ActiveSessionsSnapshot) -> ActiveSessionsSnapshot:
        """Return ``snapshot`` with its generation set, bumping it if the answer changed."""
        answer = (
            snapshot.sessions,
            snapshot.unowned,
            snapshot.servers,
            snapshot.discovery,
            snapshot.gaps,
        )
        with self._lock:
            if snapshot.discovery != "scanning" and answer != self._previous:
                self._generation += 1
                self._previous = answer
            return msgspec.structs.replace(snapshot, generation=self._generation)


def same_answer(a: ActiveSessionsSnapshot, b: ActiveSessionsSnapshot) -> bool:
    """Whether two stamped answers say the same: both settled, with the same generation.

    A ``scanning`` answer carries the generation of the last settled one but
    empty lists, so it is the same as no other answer.
    """
    return a.generation == b.generation and a.discovery != "scanning" and b.discovery != "scanning"
