"""Projection: candidates, ownership rows and a process sample become the answer's lists.

:meth:`Projection.project` is one step with one input, :class:`Inputs` (the
candidates with their owners, the store's rows and contexts, the process
sample, the descendants, the servers registry, the errors and the home's
gap), and one output, :class:`Answer`: sessions, unowned processes, live
servers and gaps (docs/design.md §5 step 3, "Descendants", §7). It is
incremental: each owner's receipt processes are kept sorted and updated by
the moves the candidates journaled, and a list nothing changed is the
previous one.

Each session's ``state`` comes from the same lists (docs/design.md §13): it
is ``running`` while it lists a receipt's process or an owned row's, and
``ended`` when only descendants are left. The projection remembers which
sessions it last listed running, so the one that lists a session ended for
the first time stamps its ``ended_at``: when the daemon saw the last own
process go, with no timer of its own (an exit wakes an observation).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec

from capsule_client.kit.receipts import SERVER_TOLERANCE_S, ServerRegistryEntry
from capsule_client.wire import ServerEntry, Session, SessionProcess, SessionState
from capsuled.processes.descendants import Descendant
from capsuled.processes.sample import ProcessSample, matches_start

from .candidates import UNASKED, Candidates
from .errors import Errors
from .ownership import Owners, row_matches
from .store import ProcessRow

__all__ = ["PROCESS_TOLERANCE_S", "Answer", "Inputs", "Projection"]

#: A sampled process matches a store row when the start times are this close (docs/design.md §5).
PROCESS_TOLERANCE_S: Final = 3.0


@dataclass(frozen=True, slots=True)
class Inputs:
    """What one projection reads.

    Attributes:
        candidates: the live receipts with their owners (and the moves since
            the last projection).
        owners: the store's rows (pid → its rows), contexts and gaps.
        sample: pid → start of every process now.
        servers: the servers registry's entries, live or not.
        errors: the paths that could not be read.
        home_gap: the gap of a missing home, None while it exists.
        descendants: (pid, started_at) → what the sessions' processes started
            (:class:`~capsuled.processes.descendants.DescendantTracker`); one that is a
            receipt's or a row's process is listed as that (the closest attribution).
    """

    candidates: Candidates
    owners: Owners
    sample: ProcessSample
    servers: Sequence[ServerRegistryEntry]
    errors: Errors
    home_gap: str | None
    descendants: Mapping[tuple[int, int], Descendant] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Answer:
    """The lists of one projection, kept to be answered again while nothing changes.

    ``owned_processes`` is session id → its processes owned by (pid, start
    time) rows; ``descendants`` session id → its ``descendant`` processes;
    ``by_id`` session id → its :class:`Session` in ``sessions``.
    """

    sessions: list[Session]
    unowned: list[SessionProcess]
    servers: list[ServerEntry]
    gaps: list[str]
    owned_processes: dict[str, list[SessionProcess]]
    by_id: dict[str, Session]
    descendants: dict[str, list[SessionProcess]] = field(default_factory=dict)


_EMPTY: Final = Answer([], [], [], [], {}, {})


class Projection:
    """The answer's lists, projected again only where what they rest on changed.

    Lists are never changed in place once answered (earlier snapshots keep
    them): a changed list is a new one.
    """

    def __init__(self) -> None:
        self._groups: dict[str | None, list[SessionProcess]] = {}  # owner → receipt processes
        self._answer: Answer | None = None
        self._contexts_revision = 0
        self._gaps_key: tuple[object, ...] | None = None
        # The sessions the last projection listed running; those it listed ended,
        # with when they were first listed so (None: never seen running here).
        self._running: set[str] = set()
        self._ended: dict[str, float | None] = {}

    def forget(self) -> None:
        """Build the next answer from scratch (the cache behind it may be half updated).

        Which sessions ran and when they ended is kept: that is what the daemon
        saw, not part of the cache.
        """
        self._answer = None

    def project(self, inputs: Inputs) -> Answer:
        """The answer's lists; the previous ones, where nothing they rest on changed."""
        candidates, owners = inputs.candidates, inputs.owners
        dirty = (
            self._regroup_all(candidates) if candidates.regroup else self._apply_moves(candidates)
        )
        if owners.contexts_revision != self._contexts_revision:
            dirty.update(self._groups)
            dirty.add("")  # the session list is built again even if no group remains
            self._contexts_revision = owners.contexts_revision
        owned_processes = _owned_processes(owners.rows, inputs.sample)
        descendants = _descendant_processes(inputs.descendants, candidates.pids(), owned_processes)
        servers = _live_servers(inputs.servers, inputs.sample)
        gaps_key = (
            inputs.home_gap,
            owners.gaps_revision,
            candidates.gaps_revision,
            inputs.errors.revision,
        )
        previous = self._answer
        if previous is None:
            previous = _EMPTY
        elif (
            not dirty
            and owned_processes == previous.owned_processes
            and descendants == previous.descendants
            and servers == previous.servers
            and gaps_key == self._gaps_key
        ):
            return previous
        sessions, by_id = self._sessions(
            previous, dirty, owned_processes, descendants, owners.contexts
        )
        unowned = self._groups.get(None)
        if unowned is None:
            unowned = previous.unowned if not previous.unowned else []
        if gaps_key != self._gaps_key or self._answer is None:
            gaps = [
                *(() if inputs.home_gap is None else (inputs.home_gap,)),
                *owners.gaps,
                *candidates.gaps(),
                *inputs.errors.gaps(),
            ]
        else:
            gaps = previous.gaps
        self._gaps_key = gaps_key
        if servers == previous.servers:
            servers = previous.servers
        self._answer = Answer(sessions, unowned, servers, gaps, owned_processes, by_id, descendants)
        return self._answer

    def _sessions(
        self,
        previous: Answer,
        dirty: set[str | None],
        owned_processes: dict[str, list[SessionProcess]],
        descendants: dict[str, list[SessionProcess]],
        contexts: dict[str, str | None],
    ) -> tuple[list[Session], dict[str, Session]]:
        """The sessions, rebuilding only the dirty ones; the previous list if none was."""
        sessions: list[Session] = []
        by_id: dict[str, Session] = {}
        owners = {owner for owner in self._groups if owner is not None}
        running: set[str] = set()
        ended: dict[str, float | None] = {}
        for session_id in sorted(owners | owned_processes.keys() | descendants.keys()):
            processes = owned_processes.get(session_id)
            started = descendants.get(session_id)
            session = previous.by_id.get(session_id)
            context = contexts.get(session_id)
            state: SessionState = "running"
            ended_at: float | msgspec.UnsetType | None = msgspec.UNSET
            if self._groups.get(session_id) or processes:
                running.add(session_id)
            else:  # only what it left behind: ended, since the first projection that saw it so
                state = "ended"
                ended_at = self._ended.get(session_id, msgspec.UNSET)
                if isinstance(ended_at, msgspec.UnsetType):
                    ended_at = time.time() if session_id in self._running else None
                ended[session_id] = ended_at
            if (
                session is None
                or session_id in dirty
                or session.context_id != context  # a session active through rows alone too
                or session.state != state
                or session.ended_at != ended_at
                or processes != previous.owned_processes.get(session_id)
                or started != previous.descendants.get(session_id)
            ):
                listed = self._groups.get(session_id, [])
                if processes or started:
                    listed = sorted([*listed, *(processes or ()), *(started or ())], key=order)
                session = Session(session_id, context, listed, state=state, ended_at=ended_at)
            sessions.append(session)
            by_id[session_id] = session
        self._running, self._ended = running, ended
        if len(sessions) == len(previous.sessions) and all(
            new is old for new, old in zip(sessions, previous.sessions, strict=True)
        ):
            return previous.sessions, previous.by_id
        return sessions, by_id

    def _regroup_all(self, candidates: Candidates) -> set[str | None]:
        """Every group from the candidates, sorted; returns the owners (all dirty)."""
        groups: dict[str | None, list[SessionProcess]] = {}
        for candidate in candidates.values():
            if candidate.process is not None and candidate.owner is not UNASKED:
                groups.setdefault(candidate.owner, []).append(candidate.process)
        for processes in groups.values():
            processes.sort(key=order)
        dirty = {*self._groups, *groups, ""}
        self._groups = groups
        candidates.take_moves()
        candidates.regroup = False
        return dirty

    def _apply_moves(self, candidates: Candidates) -> set[str | None]:
        """Update the groups the moves touched (copies: earlier answers keep theirs)."""
        dirty: set[str | None] = set()
        for owner, (removed, added) in candidates.take_moves().items():
            if sorted(removed, key=order) == sorted(added, key=order):
                continue  # came back the same
            processes = list(self._groups.get(owner, ()))
            for process in removed:
                at = bisect.bisect_left(processes, order(process), key=order)
                while at < len(processes) and processes[at] is not process:
                    at += 1
                if at == len(processes):  # not where it should be: build every group again
                    return self._regroup_all(candidates)
                del processes[at]
            for process in added:
                bisect.insort(processes, process, key=order)
            if processes:
                self._groups[owner] = processes
            else:
                self._groups.pop(owner, None)
            dirty.add(owner)
        return dirty


def _owned_processes(
    rows: dict[int, list[ProcessRow]], sample: ProcessSample
) -> dict[str, list[SessionProcess]]:
    """session id → the sampled processes it owns by (pid, start) rows."""
    owned: dict[str, list[SessionProcess]] = {}
    for pid, pid_rows in rows.items():
        for row in pid_rows:
            if row_matches(sample, pid, row, PROCESS_TOLERANCE_S):
                owned.setdefault(row.session_id, []).append(
                    SessionProcess(kind="process", pid=pid, started_at=row.started_at)
                )
    return owned


def _descendant_processes(
    found: Mapping[tuple[int, int], Descendant],
    receipt_pids: Container[int],
    owned: dict[str, list[SessionProcess]],
) -> dict[str, list[SessionProcess]]:
    """session id → its ``descendant`` processes, sorted; a pid that is a receipt's
    process (owned or not) or a row's is left to that attribution (docs/design.md §5)."""
    if not found:
        return {}
    rows = {process.pid for listed in owned.values() for process in listed}
    started: dict[str, list[SessionProcess]] = {}
    for (pid, started_at), descendant in sorted(found.items()):
        if pid in receipt_pids or pid in rows:
            continue
        started.setdefault(descendant.session_id, []).append(
            SessionProcess(
                kind="descendant",
                pid=pid,
                started_at=started_at,
                parent_pid=descendant.parent_pid,
                root_pid=descendant.root_pid,
            )
        )
    return started


def _live_servers(
    entries: Sequence[ServerRegistryEntry], sample: ProcessSample
) -> list[ServerEntry]:
    """The registry's entries whose process is alive, sorted by pid and URL."""
    live = []
    for entry in entries:
        if entry.opencode_pid not in sample or (
            entry.started_at is not None
            and not matches_start(sample, entry.opencode_pid, entry.started_at, SERVER_TOLERANCE_S)
        ):
            continue
        live.append(
            ServerEntry(
                pid=entry.opencode_pid,
                url=msgspec.UNSET if entry.url is None else entry.url,
                directory=msgspec.UNSET if entry.directory is None else entry.directory,
                started_at=msgspec.UNSET if entry.started_at is None else entry.started_at,
            )
        )
    return sorted(live, key=lambda server: (server.pid, str(server.url)))


def order(process: SessionProcess) -> tuple[str, int, int, str, str, str]:
    """The order of processes within a session's list and ``unowned``."""

    def text(value: str | msgspec.UnsetType) -> str:
        return "" if isinstance(value, msgspec.UnsetType) else value

    return (
        process.kind,
        process.pid,
        process.started_at,
        text(process.input_id),
        text(process.exec_id),
        text(process.receipt),
    )
