"""The observation: the reader's parts tied together into one answer (docs/design.md §5 steps 1-5).

:class:`ActiveSessionReader` keeps, per home, the receipts that parsed and
were live at their last read (*candidates*), the paths that could not be read
or parsed (*errors*), the changed paths the watcher reported (*pending*, via a
:class:`~capsuled.watch.changes.ChangeFeed`) and whether a full *rescan* is owed.
An *observation* brings that cache up to date against one fresh process
sample, asks the ownership store who owns the live receipts and processes,
finds the descendants of the sessions' processes
(:mod:`~capsuled.reader.lineage`, from the same sample's process table),
checks that nothing moved meanwhile, and projects an
:class:`~capsule_client.wire.ActiveSessionsSnapshot`.

Everything here blocks (directory walks, file reads, ``/proc``, SQLite): the
daemon runs :meth:`ActiveSessionReader.observe` in a worker thread, one at a
time per reader.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from capsule_client.kit.paths import store_path
from capsule_client.wire import ActiveSessionsSnapshot, DiscoveryCost
from capsuled.common.shortage import is_shortage, shortage_gap
from capsuled.home.layout import Action, action
from capsuled.processes.sample import (
    PartialSample,
    ProcessSample,
    Start,
    partial_samples,
    sample_with_table,
    still_running,
)
from capsuled.processes.table import ProcessTable
from capsuled.watch.changes import ChangeFeed

from .candidates import Candidates, wire_text
from .errors import Errors, ObservationCancelled, Shortage, Unavailable
from .generations import Generations
from .home import Home, HomeReplaced
from .lineage import Lineage, roots_of
from .ownership import Owners
from .projection import PROCESS_TOLERANCE_S, Answer, Inputs, Projection
from .receipts import ReceiptReader
from .store import OwnershipReader, StoreUnavailable, StoreVersion
from .verification import Verification, Verified
from .walk import Walk

__all__ = ["GAP_CATCHING_UP", "GAP_MOVED", "ActiveSessionReader", "Observation"]

GAP_MOVED: Final = "session ownership changed during observation; reading again"
GAP_CATCHING_UP: Final = "session discovery is catching up with file-system changes"


@dataclass(frozen=True, slots=True)
class Observation:
    """What one :meth:`ActiveSessionReader.observe` produced.

    Attributes:
        snapshot: the answer, its ``generation`` stamped by the reader's
            :class:`~capsuled.reader.generations.Generations`: two settled
            answers with the same generation say the same
            (:func:`~capsuled.reader.generations.same_answer`).
        home_replaced: the home was replaced or removed since the reader
            started; the caller should make a fresh reader for the path
            (passing this reader's ``generations``), log a warning and count it.
        watched: pid → start (from the sample) of every
            live process the answer rests on: live candidates' pids, the
            store's processes that matched the sample, live servers, the
            sessions' descendants. Its
            exit changes the answer (``capsuled.processes.exits`` watches them). None
            when the observation could not say (``unavailable``).
        verified: what a verification found; None when it did not verify.
        shortage: the observation failed because the daemon is short of
            descriptors or memory (``unavailable``, docs/design.md §8): the
            caller retries soon, nothing on disk needs to change first.
        store_writing: a writer's transaction was open when the store's
            version was read: a commit the watch reported may have been
            unreadable yet, so an observation is owed once it ends
            (:meth:`~capsuled.reader.store.OwnershipReader.writing`).
    """

    snapshot: ActiveSessionsSnapshot
    home_replaced: bool = False
    watched: Mapping[int, Start] | None = None
    verified: Verified | None = None
    shortage: bool = False
    store_writing: bool = False


class ActiveSessionReader:
    """The incremental receipt cache of one home.

    Args:
        home: the capsule home; resolved to an absolute path without symlinks
            (give the watcher :attr:`home`, so that its paths match).
        changes: the feed the watcher fills with changed paths and rescan
            requests; a fresh, empty one when omitted.
        ownership: the store reader; ``<home>/capsule.db`` when omitted.
        cancel: when set, the running observation stops before its next file
            read and raises :class:`~capsuled.reader.errors.ObservationCancelled`.
        generations: the answer counter to continue; a new one when omitted.
        trust_watcher: whether a watcher feeds ``changes`` (may be changed
            between observations: the daemon sets it from its watcher mode).
        lineage: the sessions' descendants; a new one when omitted.

    Attributes:
        held: pid → (start; pidfd) of the processes the daemon's
            exit watch holds; set before each observation. An observation that
            neither walks nor verifies polls their pidfds once and reads no
            stat for those that have not exited.

    The first observation walks from scratch.

    **Trusting the watcher.** With ``trust_watcher`` set, an observation that
    is not a rescan reads only the pending paths the watcher reported; the
    other candidates are not ``stat``-checked (docs/design.md §5 step 2 allows a re-read
    to be replaced by a check "as long as the result is the same": here that
    rests on the watcher reporting every write). The watch reports its own
    losses (an overflow or a lost watch owes a rescan at once); what it may
    still miss silently (a rewrite through a hard link elsewhere) is found by
    a verifying observation (``observe(verify_barrier_ns=...)``, docs/design.md
    §5). Without a watcher (a library user, or ``--watch off``), every
    observation ``stat``-checks every candidate and errored receipt and
    re-reads what changed.

    **Incremental observations.** Whatever did not change is not redone
    (docs/design.md §5 "Every path is exact, at the cost of the change"): an
    observation that neither walks nor verifies takes a partial process
    sample (:class:`~capsuled.processes.sample.PartialSample`: the stat of the
    pids it asks about, none for those ``held`` that have not exited);
    liveness is judged again only for the candidates of pids that are gone or
    whose start time changed (the pid index); ownership is asked only for
    what was not asked before, or for everything when the store's version
    moved (:class:`~capsuled.reader.ownership.Owners`); the projection keeps
    each list and rebuilds only what moved
    (:class:`~capsuled.reader.projection.Projection`).

    The stability check (step 4) is then: no relevant path arrived in the
    feed, the store's version did not change, and (without a trusted
    watcher) the ``stat`` check found nothing new.
    """

    def __init__(
        self,
        home: Path,
        changes: ChangeFeed | None = None,
        *,
        ownership: OwnershipReader | None = None,
        cancel: threading.Event | None = None,
        generations: Generations | None = None,
        trust_watcher: bool = False,
        lineage: Lineage | None = None,
    ) -> None:
        self._home = Home(home)
        self.home = self._home.path
        self.changes = ChangeFeed() if changes is None else changes
        self.ownership = OwnershipReader(store_path(self.home)) if ownership is None else ownership
        self.generations = Generations() if generations is None else generations
        self.trust_watcher = trust_watcher
        self.held: Mapping[int, tuple[Start, int]] = {}
        self._cancel = threading.Event() if cancel is None else cancel
        self._candidates = Candidates()
        self._errors = Errors()
        self._receipts = ReceiptReader(self._home, self._candidates, self._errors, self._cancel)
        self._walk = Walk(self._receipts)
        self._verification = Verification(self._walk)
        self._owners = Owners()
        self._projection = Projection()
        self._pending: set[str] = set()
        self._moved_dirs: set[str] = set()  # polled directories whose entries moved
        self._store_writing = False  # this observation's, see Observation.store_writing
        self._table: ProcessTable | None = None  # the latest sample's, for the descendants
        #: The sessions' descendants, also looked for between observations.
        self.lineage = Lineage() if lineage is None else lineage

    @property
    def _cost(self) -> DiscoveryCost:
        """The current (or latest) observation's cost."""
        return self._receipts.cost

    def invalidate(self) -> None:
        """Owe a full rescan: the next observation walks from scratch (``reader.rescan``)."""
        self.changes.request_rescan()

    def observe(
        self, task: str | None = None, *, verify_barrier_ns: int | None = None
    ) -> Observation:
        """Run one observation (docs/design.md §5 steps 1-5). Blocking: run it in a worker thread.

        Args:
            task: echoed in the snapshot.
            verify_barrier_ns: verify too (unless this observation walks from
                scratch): compare every listed directory and every candidate
                with what was last seen and re-read what differs. A difference
                older than this moment (Unix ns; every change before it was
                fed by the watch) counts as one the watch missed.

        Returns:
            The observation; ``snapshot.discovery`` is ``ready``, ``scanning``
            (sessions empty, a gap says why; observe again) or ``unavailable``
            (the gaps say why).

        Raises:
            ObservationCancelled: the cancel event was set.
        """
        cost = self._receipts.cost = DiscoveryCost()
        snapshot = ActiveSessionsSnapshot(
            home=self._home.text,
            observed_at=0.0,
            generation=0,
            task=task,
            discovery="ready",
            sessions=[],
            unowned=[],
            servers=[],
            gaps=[],
            cost=cost,
        )
        home_replaced = False
        watched: dict[int, Start] | None = None
        verified: Verified | None = None
        shortage = False
        self._store_writing = False
        try:
            watched, verified = self._observe_into(snapshot, verify_barrier_ns)
        except ObservationCancelled:
            self._owe_rescan()
            raise
        except Unavailable as exc:
            self._owe_rescan()
            home_replaced = isinstance(exc, HomeReplaced)
            shortage = isinstance(exc, Shortage)
            _unavailable(snapshot, str(exc))
        except StoreUnavailable as exc:
            self._owners.forget()
            shortage = exc.shortage is not None
            _unavailable(snapshot, str(exc))
        except OSError as exc:
            self._owe_rescan()
            shortage = is_shortage(exc)
            _unavailable(
                snapshot, shortage_gap(exc.errno) if shortage else f"observation failed: {exc}"
            )
        cost.retained = len(self._candidates)
        if isinstance(self._receipts.sample, PartialSample):
            cost.process_stats += self._receipts.sample.reads
        snapshot.gaps = [wire_text(gap) for gap in snapshot.gaps]
        snapshot.observed_at = time.time()
        return Observation(
            self.generations.stamp(snapshot),
            home_replaced,
            watched,
            verified,
            shortage=shortage,
            store_writing=self._store_writing,
        )

    def _observe_into(
        self, snapshot: ActiveSessionsSnapshot, verify_barrier_ns: int | None
    ) -> tuple[dict[int, Start], Verified | None]:
        """Steps 1-4 into ``snapshot``; returns the live pids the answer rests on and
        what a verification found."""
        version, verified = self._collect(verify_barrier_ns)
        sample = self._receipts.sample
        self._owners.refresh(self.ownership, version, self._candidates)
        roots = roots_of(self._candidates, self._owners, sample, PROCESS_TOLERANCE_S)
        descendants = self.lineage.observe(roots, self._table, sample)
        answer = self._projection.project(
            Inputs(
                candidates=self._candidates,
                owners=self._owners,
                sample=self._receipts.sample,
                servers=self._receipts.servers,
                errors=self._errors,
                home_gap=self._home.missing_gap() if self._home.missing else None,
                descendants=descendants,
            )
        )
        snapshot.sessions = answer.sessions
        snapshot.unowned = answer.unowned
        snapshot.servers = answer.servers
        snapshot.gaps = answer.gaps
        watched = self._watched(answer)
        moved = self._moved(version)
        if moved or self._walk.rescan:
            snapshot.discovery = "scanning"
            snapshot.sessions = []
            snapshot.unowned = []
            snapshot.gaps = [*answer.gaps, GAP_MOVED if moved else GAP_CATCHING_UP]
        return watched, verified

    def _watched(self, answer: Answer) -> dict[int, Start]:
        """pid → sampled start of every live process the answer rests on.

        The candidates' pids (from the pid index), the store's processes that
        matched the sample, the live servers: O(processes), not O(receipts).
        """
        sample = self._receipts.sample
        pids = set(self._candidates.pids())
        pids.update(p.pid for listed in answer.owned_processes.values() for p in listed)
        pids.update(server.pid for server in answer.servers)
        pids.update(p.pid for listed in answer.descendants.values() for p in listed)
        starts = ((pid, sample.get(pid)) for pid in pids)
        return {pid: start for pid, start in starts if start is not None}

    def _owe_rescan(self) -> None:
        """The cache may be half updated: walk from scratch next time, and forget the answer."""
        self._walk.rescan = True
        self._projection.forget()

    def _collect(self, verify_barrier_ns: int | None) -> tuple[StoreVersion, Verified | None]:
        """Steps 1-2: bring the cache up to date against a fresh sample.

        Returns the store's version, taken before anything is asked of it,
        and what a verification found (None without one).
        """
        self._receipts.check_cancelled()
        if self._home.check():
            self._walk.rescan = True
        self._take_changes()
        self._cost.dirty_paths = len(self._pending)
        # Before the version: a write transaction open now may hold a commit
        # that the watch reported but the version cannot show yet.
        self._store_writing = self.ownership.writing()
        version = self.ownership.version()
        full = self._walk.rescan or verify_barrier_ns is not None or not self.trust_watcher
        self._resample(full)
        verified = None
        if self._walk.rescan:
            self._pending.clear()
            self._moved_dirs.clear()
            self._walk.from_scratch()
            self._resample(True)
        else:
            pending, self._pending = self._pending, set()
            self._walk.apply_all(pending)
            moved_dirs, self._moved_dirs = self._moved_dirs, set()
            self._walk.recheck_below(moved_dirs)
            if verify_barrier_ns is not None:
                verified = self._verification.verify(verify_barrier_ns)
            elif not self.trust_watcher:
                self._walk.recheck_all()
        return version, verified

    def _resample(self, full: bool) -> None:
        """Take a fresh sample (``full``: the whole table, else a :class:`PartialSample`);
        judge again the candidates of pids that went or were reused."""
        self._cost.process_samples += 1
        previous = self._receipts.sample
        if isinstance(previous, PartialSample):
            previous = previous.answered()  # frozen: asking it must not read /proc now
        sample: ProcessSample
        if full or not partial_samples():
            sample, self._table = sample_with_table()
        else:
            sample, self._table = PartialSample(still_running(self.held)), None
        self._receipts.sample = sample
        if self._table is not None:
            self._cost.process_stats += len(self._table.stats)
        elif not isinstance(sample, PartialSample):
            self._cost.process_stats += len(sample)
        candidates = self._candidates
        for pid in list(candidates.pids()):
            start = sample.get(pid)
            if start is not None and start == previous.get(pid):
                continue
            for key in candidates.of_pid(pid):
                if not candidates[key].live(sample):
                    candidates.drop(key)

    def _take_changes(self) -> bool:
        """Move the feed's relevant paths into ``pending``, its moved directories aside
        and its rescan request into the walk's ``rescan``; True if a path or a moved
        directory that a re-read can cover arrived."""
        changes = self.changes.drain()
        if changes.rescan:
            self._walk.rescan = True
        moved = False
        for raw in changes.paths:
            path = self._home.unalias(os.path.normpath(os.fspath(raw)))
            what = action(self._home.parts(path))
            if what is Action.RESCAN:
                self._walk.rescan = True
            elif what is not Action.IGNORE:
                self._pending.add(path)
                moved = True
        for raw in changes.moved:
            self._moved_dirs.add(self._home.unalias(os.path.normpath(os.fspath(raw))))
            moved = True
        return moved

    def _moved(self, version: StoreVersion) -> bool:
        """Step 4: did candidates, ownership or the file system move during the observation?

        Ownership moved when the store's version is not the one taken before
        it was asked; candidates moved when (without a trusted watcher) the
        ``stat`` check changes anything, against the same sample.
        """
        moved = False
        if not self.trust_watcher:
            before = self._walk.changes()
            self._walk.recheck_all()
            moved = self._walk.changes() != before
        moved |= self.ownership.version() != version
        moved |= self._take_changes()  # a rescan owed is reported apart: catching up
        return moved


def _unavailable(snapshot: ActiveSessionsSnapshot, gap: str) -> None:
    """No answer: the one gap says why (not the receipt gaps, which may be 4 MiB)."""
    snapshot.discovery = "unavailable"
    snapshot.sessions = []
    snapshot.unowned = []
    snapshot.servers = []
    snapshot.gaps = [gap]
