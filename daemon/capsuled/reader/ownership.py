"""Ownership: the store's rows for the candidates and its process rows (docs/design.md §5 step 3).

This is the one ownership cache: the store reader queries only what it is
asked. Here, while the store's version stays the same, only candidates not
asked before are asked; when the version moves (or the store reader is
another one), everything is asked again, and every (pid, start) process row
read: the rows name the pids whose stat the observation reads, so it needs no
list of every process (docs/design.md §5).
"""

from __future__ import annotations

import sys

from capsuled.home.layout import Kind
from capsuled.processes.sample import ProcessSample, matches_start

from .candidates import UNASKED, Candidates
from .store import Ownership, OwnershipReader, ProcessRow, StoreVersion

__all__ = ["Owners", "row_matches"]


def row_matches(sample: ProcessSample, pid: int, row: ProcessRow, tolerance_s: float) -> bool:
    """Whether the process row ``row`` of ``pid`` names a process running in ``sample``:
    by its exact identity where it has one, else its start within ``tolerance_s``
    (docs/design.md §5 "Projection", §14)."""
    return matches_start(
        sample,
        pid,
        row.started_at,
        tolerance_s,
        boot_id=row.boot_id,
        start_ticks=row.start_ticks,
    )


class Owners:
    """The store's answers the latest projection rests on.

    Attributes:
        rows: pid → its :class:`~capsuled.reader.store.ProcessRow` list: every
            process row of the store.
        contexts: session id → context id of every session named.
        gaps: what the store's answer could not cover (a missing store).
        contexts_revision: grows when ``contexts`` was replaced by a different one.
        gaps_revision: grows when ``gaps`` changed.
    """

    def __init__(self) -> None:
        self.rows: dict[int, list[ProcessRow]] = {}
        self.contexts: dict[str, str | None] = {}
        self.gaps: tuple[str, ...] = ()
        self.contexts_revision = 0
        self.gaps_revision = 0
        self._version: StoreVersion | object = UNASKED  # the store version these came from
        self._asked_of: OwnershipReader | None = None  # the store reader they came from

    def forget(self) -> None:
        """Ask everything again next time (the store could not be read)."""
        self._version = UNASKED

    def refresh(
        self,
        store: OwnershipReader,
        version: StoreVersion,
        candidates: Candidates,
    ) -> None:
        """Ask ``store`` about what it was not asked yet, or everything if it changed.

        Raises:
            StoreUnavailable: the store exists but cannot be read.
        """
        # Versions of two store readers (connections) are not comparable.
        everything = version != self._version or store is not self._asked_of
        if everything:
            keys: list[str] = [k for k, c in candidates.items() if c.gap is None]
        else:
            keys = sorted(candidates.unasked)
        if not (everything or keys):
            return
        inputs: list[str] = []
        execs: list[str] = []
        for key in keys:
            candidate = candidates[key]
            (execs if candidate.kind is Kind.EXEC else inputs).append(candidate.key)
        answer = store.session_process_ownership(inputs, execs, None if everything else ())
        if everything:
            self.rows = answer.processes
            if answer.contexts != self.contexts:
                self.contexts_revision += 1
            if answer.gaps != self.gaps:
                self.gaps_revision += 1
            self.contexts = {}
            self.gaps = answer.gaps
        self.contexts.update(answer.contexts)
        _assign(candidates, keys, answer)
        if not candidates.unasked:
            candidates.unasked = set()  # a set does not shrink as it empties
        self._version = version
        self._asked_of = store


def _assign(candidates: Candidates, keys: list[str], answer: Ownership) -> None:
    """Set the owners of the candidates at ``keys`` from ``answer``."""
    for key in keys:
        candidate = candidates[key]
        by_key = answer.execs if candidate.kind is Kind.EXEC else answer.inputs
        owner = by_key.get(candidate.key)
        if owner is not None:
            owner = sys.intern(owner)  # one string per session, not per receipt
        candidates.set_owner(key, owner)
