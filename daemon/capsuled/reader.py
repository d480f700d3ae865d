"""The active-sessions reader: the receipt cache and ``observe`` (docs/design.md §3-§5).

:class:`ActiveSessionReader` keeps, per home, the receipts that parsed and
were live at their last read (*candidates*), the paths that could not be read
or parsed (*errors*), the changed paths the watcher reported (*pending*, via a
:class:`~capsuled.changes.ChangeFeed`) and whether a full *rescan* is owed.
An *observation* brings that cache up to date against one fresh process
sample, asks the ownership store who owns the live receipts and processes,
checks that nothing moved meanwhile, and projects an
:class:`~capsule_client.protocol.ActiveSessionsSnapshot`.

Everything here blocks (directory walks, file reads, ``/proc``, SQLite): the
daemon runs :meth:`ActiveSessionReader.observe` in a worker thread, one at a
time per reader.

Departures from the seed, each allowed by docs/design.md §5:

* Step 2 ("re-reads every candidate ... a re-read may be replaced by a
  ``stat`` check ... as long as the result is the same"): while a watcher
  feeds the reader (``trust_watcher``), the check is the watcher itself, and
  only the paths it reported are read; verification (``verify_barrier_ns``)
  is the net under what a watch may lose. Without one, step 2 re-checks a
  candidate with ``lstat``
  (device, inode, size, ``mtime_ns``, ``ctime_ns``) and re-reads only what
  changed. A file whose timestamps were within :data:`RACY_WINDOW_NS` of the
  moment it was read is re-read anyway, because a later write in the same
  timestamp tick would leave the same stamps (git's "racy clean" problem).
  Liveness is re-evaluated against every fresh sample, for the candidates of
  the pids the sample shows gone or reused.
* Step 3 asks the store only about what it was not asked before, unless the
  store's ``PRAGMA data_version`` moved; step 4 compares that version instead
  of querying again.
* A pending path that forces a rescan makes *this* observation walk from
  scratch, instead of answering ``scanning`` first. A changed run directory
  (``runs/<run>``) does not force one: it is listed from scratch, as a
  changed input directory is, so a new run costs its own receipts, not a walk
  of the home.
* Watcher changes that cannot affect the answer (the store, traces under
  ``sessions/``, ``manifest.json``, hidden files) are dropped, so a busy trace
  does not keep the answer ``scanning``.
* The servers registry is kept whole and its entries' liveness is decided
  against each observation's sample.
"""

from __future__ import annotations

import bisect
import enum
import errno
import os
import stat
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeAlias

import msgspec

from capsule_client.paths import store_path
from capsule_client.protocol import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    ServerEntry,
    Session,
    SessionProcess,
)
from capsule_client.receipts import (
    EXEC_RECEIPT_TOLERANCE_S,
    MAX_RECEIPT_BYTES,
    PROVIDER_CLIENT_TOLERANCE_S,
    SERVER_TOLERANCE_S,
    ExecReceipt,
    ProviderClientReceipt,
    ReceiptError,
    ServerRegistryEntry,
    decode_exec_receipt,
    decode_provider_client_receipt,
    decode_servers_registry,
    is_valid_input_id,
)
from capsuled.changes import ChangeFeed
from capsuled.home import home_refusal
from capsuled.layout import walked
from capsuled.listings import RACY_MARGIN_NS, Listings
from capsuled.processes import ProcessSample, matches_start, sample_processes
from capsuled.store import Ownership, OwnershipReader, StoreUnavailable, StoreVersion

__all__ = [
    "GAP_CATCHING_UP",
    "GAP_HOME_REPLACED",
    "GAP_MOVED",
    "GAP_TOO_MANY_ERRORS",
    "MAX_ERRORS",
    "MAX_ERROR_BYTES",
    "PROCESS_TOLERANCE_S",
    "RACY_WINDOW_NS",
    "ActiveSessionReader",
    "Generations",
    "Observation",
    "ObservationCancelled",
    "Verified",
    "run_base",
]

#: Bounds on unresolved paths; past either, the observation fails (docs/design.md §5).
MAX_ERRORS: Final = 4096
MAX_ERROR_BYTES: Final = 4 * 1024 * 1024

#: A sampled process matches a store row when the start times are this close (docs/design.md §5).
PROCESS_TOLERANCE_S: Final = 3.0

#: A file whose mtime/ctime lies less than this before the moment it was read
#: is re-read at its next check instead of trusting ``stat``. One second covers
#: every Linux file system's timestamp tick and HFS+'s whole seconds.
RACY_WINDOW_NS: Final = 1_000_000_000

GAP_TOO_MANY_ERRORS: Final = (
    "too much unresolved session ownership; repair receipts before retrying"
)
GAP_HOME_REPLACED: Final = "home directory was replaced or removed"
GAP_MOVED: Final = "session ownership changed during observation; reading again"
GAP_CATCHING_UP: Final = "session discovery is catching up with file-system changes"

_RUNS: Final = "runs"
_PROVIDER_CLIENTS: Final = "provider-clients"
_EXEC_PARTS: Final = ("runtime", "exec-processes")
_SERVERS_PARTS: Final = ("runtime", "opencode-servers.json")

Receipt: TypeAlias = ProviderClientReceipt | ExecReceipt
_Parts: TypeAlias = tuple[str, ...]


class ObservationCancelled(Exception):
    """The reader's cancel event was set; the observation stopped between two reads.

    The reader owes a rescan afterwards, since its cache may be half updated.
    """


class _Unavailable(Exception):
    """This observation cannot answer; the message becomes its gap."""


class _HomeReplaced(_Unavailable):
    def __init__(self) -> None:
        super().__init__(GAP_HOME_REPLACED)


class _Kind(enum.Enum):
    PROVIDER_CLIENT = "provider_client"
    EXEC = "exec"


class _Action(enum.Enum):
    """What a changed path asks of the cache (the original ``reconcile``)."""

    IGNORE = enum.auto()
    RESCAN = enum.auto()
    SERVERS = enum.auto()
    WALK = enum.auto()
    PROVIDER_CLIENT = enum.auto()
    EXEC = enum.auto()


def _receipt_kind(parts: _Parts) -> _Kind | None:
    """The receipt kind of a path under the home, or None for no receipt (docs/design.md §2)."""
    name = parts[-1] if parts else ""
    if not name.endswith(".json") or name.startswith("."):
        return None
    if len(parts) == 3 and parts[:2] == _EXEC_PARTS:
        return _Kind.EXEC
    if (
        len(parts) == 5
        and parts[0] == _RUNS
        and parts[3] == _PROVIDER_CLIENTS
        and not parts[1].startswith(".")
        and not parts[2].startswith(".")
    ):
        return _Kind.PROVIDER_CLIENT
    return None


_walked = walked


def _action(parts: _Parts | None) -> _Action:
    """Classify a changed path (relative parts; None when outside the home)."""
    if parts is None:
        return _Action.RESCAN
    if any(part.startswith(".") for part in parts):
        return _Action.IGNORE
    if parts in ((), (_RUNS,), ("runtime",), _EXEC_PARTS):
        return _Action.RESCAN
    if parts == _SERVERS_PARTS:
        return _Action.SERVERS
    kind = _receipt_kind(parts)
    if kind is _Kind.EXEC:
        return _Action.EXEC
    if kind is _Kind.PROVIDER_CLIENT:
        return _Action.PROVIDER_CLIENT
    if parts[0] == _RUNS and _walked(parts):
        return _Action.WALK
    return _Action.IGNORE


@dataclass(frozen=True, slots=True)
class _Signature:
    """What ``stat`` says about a file when it was read; ``stable`` if a re-check may trust it."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    stable: bool

    @classmethod
    def of(cls, st: os.stat_result, read_ns: int) -> _Signature:
        newest = max(st.st_mtime_ns, st.st_ctime_ns)
        return cls(
            st.st_dev,
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            stable=newest < read_ns - RACY_WINDOW_NS,
        )

    def unchanged(self, st: os.stat_result) -> bool:
        return self.stable and (
            self.dev,
            self.ino,
            self.size,
            self.mtime_ns,
            self.ctime_ns,
        ) == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


#: The owner of a candidate whose ownership was not asked yet.
_UNASKED: Final = "\0unasked"


class _Candidate(msgspec.Struct, gc=False):
    """A receipt that parsed and was live at its last read, projected once.

    The decoded receipt is not kept: ``process`` carries what snapshots list
    (None when the input directory's name is not an input id: then ``gap``
    says so), ``pid`` and ``start_s`` (the receipt's start time, Unix
    seconds, unrounded) decide liveness. ``key`` is the input id or exec id
    asked of the store; ``owner`` the session that owns it (None: nobody)
    once ownership was asked, :data:`_UNASKED` before. ``signature`` is None
    when the reader trusts the watcher (nothing re-checks it).

    Untracked by the garbage collector (``gc=False``): it refers to nothing
    that could refer back to it.
    """

    kind: _Kind
    pid: int
    start_s: float
    signature: _Signature | None
    process: SessionProcess | None
    key: str
    gap: str | None
    owner: str | None = _UNASKED

    def same(self, other: _Candidate) -> bool:
        """Whether ``other`` says what this one says (a re-read of an unchanged receipt)."""
        return (
            self.kind is other.kind
            and self.pid == other.pid
            and self.start_s == other.start_s
            and self.key == other.key
            and self.gap == other.gap
            and self.process == other.process
        )

    def live(self, sample: ProcessSample) -> bool:
        """Liveness against one sample (docs/design.md §3; the original ``Receipt::live``)."""
        tolerance_s = (
            EXEC_RECEIPT_TOLERANCE_S if self.kind is _Kind.EXEC else PROVIDER_CLIENT_TOLERANCE_S
        )
        return matches_start(sample, self.pid, self.start_s, tolerance_s)


class _Numbers:
    """One object per distinct pid and start time among the candidates.

    Thousands of receipts may name the same few processes; each decoded
    receipt brings its own ``int`` and ``float`` objects (32 and 24 bytes),
    which the candidate and its process entry would keep. Sharing them saves
    about 80 bytes per retained receipt. Emptied at each walk from scratch,
    so numbers of receipts long gone are not kept.
    """

    __slots__ = ("_floats", "_ints")

    def __init__(self) -> None:
        self._ints: dict[int, int] = {}
        self._floats: dict[float, float] = {}

    def int(self, value: int) -> int:
        return self._ints.setdefault(value, value)

    def float(self, value: float) -> float:
        return self._floats.setdefault(value, value)

    def clear(self) -> None:
        self._ints.clear()
        self._floats.clear()


def _candidate(
    relative: str,
    kind: _Kind,
    receipt: Receipt,
    signature: _Signature | None,
    input_dir: str,
    numbers: _Numbers,
) -> _Candidate:
    """``relative`` (the path under the home) becomes the process's ``receipt``."""
    pid = numbers.int(receipt.pid)
    if isinstance(receipt, ExecReceipt):
        started_at = numbers.int(receipt.started_at)
        process = SessionProcess(
            kind="exec",
            pid=pid,
            started_at=started_at,
            exec_id=receipt.exec_id,
            command=msgspec.UNSET if receipt.command is None else sys.intern(receipt.command),
            receipt=_wire_text(relative),
        )
        return _Candidate(kind, pid, started_at, signature, process, receipt.exec_id, None)
    start_s = numbers.float(receipt.started_at_s)
    input_id = sys.intern(relative.split(os.sep)[2])  # shared by the input's clients
    if not is_valid_input_id(input_id):
        gap = (
            f"{input_dir}: {input_id!r} is not an input id"
            " (inp_ followed by 1-128 of [A-Za-z0-9_-])"
        )
        return _Candidate(kind, pid, start_s, signature, None, input_id, gap)
    process = SessionProcess(
        kind="provider_client",
        pid=pid,
        started_at=numbers.int(round(start_s)),
        input_id=input_id,
        provider=msgspec.UNSET if receipt.provider is None else sys.intern(receipt.provider),
        receipt=_wire_text(relative),
    )
    return _Candidate(kind, pid, start_s, signature, process, input_id, None)


@dataclass(slots=True)
class _Error:
    message: str
    kind: _Kind | None  # None for a directory or the servers registry
    signature: _Signature | None


@dataclass(frozen=True, slots=True)
class _Answer:
    """The lists of the latest projection, kept to be answered again while nothing changes.

    ``owned_processes`` is session id → its processes owned by (pid, start
    time) rows; ``by_id`` session id → its :class:`Session` in ``sessions``.
    """

    sessions: list[Session]
    unowned: list[SessionProcess]
    servers: list[ServerEntry]
    gaps: list[str]
    owned_processes: dict[str, list[SessionProcess]]
    by_id: dict[str, Session]


@dataclass(frozen=True, slots=True)
class Observation:
    """What one :meth:`ActiveSessionReader.observe` produced.

    Attributes:
        snapshot: the answer, its ``generation`` stamped by the reader's
            :class:`Generations`.
        home_replaced: the home was replaced or removed since the reader
            started; the caller should make a fresh reader for the path
            (passing this reader's ``generations``), log a warning and count it.
        watched: pid → start time (Unix seconds, from the sample) of every
            live process the answer rests on: live candidates' pids, the
            store's processes that matched the sample, live servers. Its
            exit changes the answer (``capsuled.exits`` watches them). None
            when the observation could not say (``unavailable``).
    """

    snapshot: ActiveSessionsSnapshot
    home_replaced: bool = False
    watched: Mapping[int, float] | None = None
    verified: Verified | None = None


@dataclass(frozen=True, slots=True)
class Verified:
    """What a verification found (docs/design.md §5 "Verification").

    Attributes:
        checked: directories and candidates (and errored receipts) compared.
        missed: paths whose change the watch had not reported, sorted.
    """

    checked: int
    missed: list[str]


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


def _describe(error: OSError) -> str:
    return error.strerror or str(error)


def _wire_text(text: str) -> str:
    """``text`` that JSON can carry: undecodable file-name bytes spelt ``\\xNN``.

    POSIX names are bytes; Python gives the ones that are not UTF-8 as lone
    surrogates (``surrogateescape``), which no JSON encoder accepts. A gap or
    a receipt path naming such a file must still reach the wire (docs/design.md §3: an
    error for that path, never a crash).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
        return raw.decode("utf-8", "backslashreplace")
    return text


class ActiveSessionReader:
    """The incremental receipt cache of one home (the original ``ActiveSessionReader``).

    Args:
        home: the capsule home; resolved to an absolute path without symlinks
            (give the watcher :attr:`home`, so that its paths match).
        changes: the feed the watcher fills with changed paths and rescan
            requests; a fresh, empty one when omitted.
        ownership: the store reader; ``<home>/capsule.db`` when omitted.
        cancel: when set, the running observation stops before its next file
            read and raises :class:`ObservationCancelled`.
        generations: the answer counter to continue; a new one when omitted.
        trust_watcher: whether a watcher feeds ``changes`` (may be changed
            between observations: the daemon sets it from its watcher mode).

    The first observation walks from scratch.

    **Trusting the watcher.** With ``trust_watcher`` set, an observation that
    is not a rescan reads only the pending paths the watcher reported; the
    other candidates are not ``stat``-checked (docs/design.md §5 step 2 allows a re-read
    to be replaced by a check "as long as the result is the same": here that
    rests on the watcher reporting every write). The watch reports its own
    losses (an overflow or a lost watch owes a rescan at once); what it may
    still miss silently (a rewrite through a hard link elsewhere) is found by
    a verifying observation (``observe(verify_barrier_ns=...)``, docs/design.md
    §5): a ``stat`` of every listed directory and every candidate, re-reading
    only what differs. Without a watcher (a library user, or ``--watch off``),
    every observation ``stat``-checks every candidate and errored receipt and
    re-reads what changed.

    **Incremental observations.** Whatever did not change is not redone:

    * liveness: candidates are indexed by pid, and each new process sample is
      compared with the previous one; only the candidates of pids that are
      gone or whose start time changed are judged again, so an unchanged
      process table costs O(processes), not O(receipts);
    * ownership is asked only for candidates not asked before and pids not
      sampled before, and asked again for everything when the store's
      :meth:`~capsuled.store.OwnershipReader.version` changed;
    * projection: each session's list (and ``unowned``) is kept sorted and
      updated by the candidates that came, went or changed owner; when
      nothing changed, the previous lists are the answer (and its
      generation stays).

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
    ) -> None:
        self.home = Path(home).resolve()
        self._home = str(self.home)
        # The home as given, if symlinks made it differ: a watcher given that
        # path reports changes under it.
        self._alias = os.path.abspath(home) if os.path.abspath(home) != self._home else None
        self.changes = ChangeFeed() if changes is None else changes
        self.ownership = OwnershipReader(store_path(self.home)) if ownership is None else ownership
        self.generations = Generations() if generations is None else generations
        self.trust_watcher = trust_watcher
        self._cancel = threading.Event() if cancel is None else cancel
        self._uid = os.geteuid()
        try:
            self._identity = self._stat_home()
        except (_Unavailable, OSError):  # reported by the first observation
            self._identity = None
        # Candidates are keyed by their path relative to the home: the same
        # string object is the process's ``receipt`` (one copy per receipt).
        self._candidates: dict[str, _Candidate] = {}
        self._numbers = _Numbers()
        self._by_pid: dict[int, dict[str, None]] = {}  # pid → candidate keys
        self._errors: dict[str, _Error] = {}
        self._error_bytes = 0
        self._servers: list[ServerRegistryEntry] = []
        self._servers_signature: _Signature | None = None
        self._pending: set[str] = set()
        self._listings = Listings()
        self._seen: set[str] | None = None  # paths read or errored while relisting
        self._linked_dirs: dict[str, bool] = {}  # parent → symlink on the way, per observation
        self._rescan = True
        self._cost = DiscoveryCost()
        # Liveness: the sample every candidate was last judged against.
        self._sample: dict[int, float] = {}
        # Ownership, as of store version ``_store_version``.
        self._store_version: StoreVersion | object = _UNASKED
        self._asked_of: OwnershipReader | None = None  # the store reader those came from
        self._asked_pids: set[int] = set()
        self._rows: dict[int, list[tuple[int, str]]] = {}
        self._contexts: dict[str, str | None] = {}
        self._ownership_gaps: tuple[str, ...] = ()
        self._unasked: set[str] = set()  # candidate paths whose owner is not asked yet
        # Projection: the sorted lists of the previous answer, and what moved since.
        self._groups: dict[str | None, list[SessionProcess]] = {}  # owner → receipt processes
        self._moves: dict[str | None, tuple[list[SessionProcess], list[SessionProcess]]] = {}
        self._regroup = True  # rebuild every group from the candidates
        self._gap_counts: dict[str, int] = {}  # candidate gaps (invalid input ids)
        self._gaps_changed = True  # candidate gaps, errors or the store's gaps
        self._contexts_changed = False
        self._mutations = 0  # changes to candidates and errors, for the step 4 check
        self._answer: _Answer | None = None
        self._verify_barrier_ns: int | None = None
        self._verified: Verified | None = None

    # ----------------------------------------------------------------------
    # Public surface

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
        self._cost = DiscoveryCost()
        snapshot = ActiveSessionsSnapshot(
            home=self._home,
            observed_at=0.0,
            generation=0,
            task=task,
            discovery="ready",
            sessions=[],
            unowned=[],
            servers=[],
            gaps=[],
            cost=self._cost,
        )
        home_replaced = False
        watched: dict[int, float] | None = None
        self._verify_barrier_ns = verify_barrier_ns
        self._verified = None
        try:
            watched = self._observe_into(snapshot)
        except ObservationCancelled:
            self._owe_rescan()
            raise
        except _Unavailable as exc:
            self._owe_rescan()
            home_replaced = isinstance(exc, _HomeReplaced)
            self._unavailable(snapshot, str(exc))
        except StoreUnavailable as exc:
            self._store_version = _UNASKED
            self._unavailable(snapshot, str(exc))
        except OSError as exc:
            self._owe_rescan()
            self._unavailable(snapshot, f"observation failed: {exc}")
        self._cost.retained = len(self._candidates)
        snapshot.gaps = [_wire_text(gap) for gap in snapshot.gaps]
        snapshot.observed_at = time.time()
        return Observation(self.generations.stamp(snapshot), home_replaced, watched, self._verified)

    # ----------------------------------------------------------------------
    # The observation

    def _observe_into(self, snapshot: ActiveSessionsSnapshot) -> dict[int, float]:
        """Steps 1-4 into ``snapshot``; returns the live pids the answer rests on."""
        version = self._collect()
        self._refresh_ownership(version)
        answer = self._project()
        snapshot.sessions = answer.sessions
        snapshot.unowned = answer.unowned
        snapshot.servers = answer.servers
        snapshot.gaps = answer.gaps
        watched = self._watched(answer)
        if self._moved(version):
            snapshot.discovery = "scanning"
            snapshot.sessions = []
            snapshot.unowned = []
            snapshot.gaps = [*answer.gaps, GAP_MOVED]
        elif self._rescan:
            snapshot.discovery = "scanning"
            snapshot.sessions = []
            snapshot.unowned = []
            snapshot.gaps = [*answer.gaps, GAP_CATCHING_UP]
        return watched

    def _watched(self, answer: _Answer) -> dict[int, float]:
        """pid → sampled start time of every live process the answer rests on.

        The candidates' pids (from the pid index), the store's processes that
        matched the sample, the live servers: O(processes), not O(receipts).
        """
        sample = self._sample
        pids = set(self._by_pid)
        pids.update(p.pid for listed in answer.owned_processes.values() for p in listed)
        pids.update(server.pid for server in answer.servers)
        return {pid: sample[pid] for pid in pids if pid in sample}

    @staticmethod
    def _unavailable(snapshot: ActiveSessionsSnapshot, gap: str) -> None:
        """No answer: the one gap says why (not the receipt gaps, which may be 4 MiB)."""
        snapshot.discovery = "unavailable"
        snapshot.sessions = []
        snapshot.unowned = []
        snapshot.servers = []
        snapshot.gaps = [gap]

    def _owe_rescan(self) -> None:
        """The cache may be half updated: walk from scratch next time, and forget the answer."""
        self._rescan = True
        self._answer = None

    def _collect(self) -> StoreVersion:
        """Steps 1-2: bring the cache up to date against a fresh sample.

        Returns the store's version, taken before anything is asked of it.
        """
        self._check_cancelled()
        self._check_home()
        self._take_changes()
        self._cost.dirty_paths = len(self._pending)
        version = self.ownership.version()
        self._resample()
        if self._rescan:
            self._numbers.clear()
            self._walk_from_scratch()
            self._resample()
        else:
            pending, self._pending = self._pending, set()
            self._linked_dirs = {}
            for path in sorted(pending):
                self._apply(path)
            if self._verify_barrier_ns is not None:
                self._verified = self._verify(self._verify_barrier_ns)
            elif not self.trust_watcher:
                self._recheck_all()
        return version

    def _verify(self, barrier_ns: int) -> Verified:
        """Compare listed directories and candidates with what was last seen; re-read what differs.

        Costs a ``stat`` per listed directory and per candidate (and errored
        receipt), plus a listing of each directory whose signature moved: it
        grows with directories and candidates, not with stale receipts.
        """
        checked = 0
        missed: list[str] = []
        for parts in ((_RUNS,), _EXEC_PARTS):  # a root that was missing at its last walk
            root = os.path.join(self._home, *parts)
            checked += 1
            if root not in self._listings and self._is_real_directory(parts):
                self._rescan = True  # what a change to it asks, as an event would
                if _older_than(root, barrier_ns - RACY_MARGIN_NS):
                    missed.append(root)
        for directory in self._listings.paths():
            self._check_cancelled()
            checked += 1
            differing = self._listings.differing(directory, barrier_ns, self._matters)
            for path, racy in differing or ():
                before = self._mutations
                self._apply(path)
                # A change during this run (its entry's own stamps are young)
                # is still on its way through the watch: not a miss.
                if (
                    self._mutations != before
                    and not racy
                    and _older_than(path, barrier_ns - RACY_MARGIN_NS)
                ):
                    missed.append(path)
        for path in [path for path, error in self._errors.items() if error.kind is None]:
            checked += 1
            if not os.path.lexists(path):  # a directory's error, the directory gone
                self._clear_error(path)
                if _older_than(path, barrier_ns - RACY_MARGIN_NS):
                    missed.append(path)
        receipts = [path for path, error in self._errors.items() if error.kind is not None]
        for path in [*(os.path.join(self._home, key) for key in self._candidates), *receipts]:
            checked += 1
            before = self._mutations
            self._recheck(path)
            if self._mutations != before and _older_than(path, barrier_ns - RACY_MARGIN_NS):
                missed.append(path)
        self._recheck_servers()
        return Verified(checked, sorted(set(missed)))

    def _is_real_directory(self, parts: _Parts) -> bool:
        """Whether ``parts`` is a directory reached from the home through no symlink."""
        for depth in range(1, len(parts) + 1):
            try:
                st = os.lstat(os.path.join(self._home, *parts[:depth]))
            except OSError:
                return False
            if not stat.S_ISDIR(st.st_mode):
                return False
        return True

    def _matters(self, path: str) -> bool:
        """Whether an entry at ``path`` is one a listing keeps (a receipt or a walked directory)."""
        return _action(self._parts(path)) is not _Action.IGNORE

    def _resample(self) -> None:
        """Take a fresh sample; judge again the candidates of pids that went or were reused."""
        self._cost.process_samples += 1
        sample = sample_processes()
        previous, self._sample = self._sample, sample
        for pid, start in previous.items():
            if sample.get(pid) == start:
                continue
            for key in list(self._by_pid.get(pid, ())):
                if not self._candidates[key].live(sample):
                    self._drop(key)

    def _take_changes(self) -> bool:
        """Move the feed's relevant paths into ``pending`` and its rescan request into
        ``_rescan``; True if a path that a re-read can cover arrived."""
        changes = self.changes.drain()
        self._rescan |= changes.rescan
        moved = False
        for raw in changes.paths:
            path = self._unalias(os.path.normpath(os.fspath(raw)))
            action = _action(self._parts(path))
            if action is _Action.RESCAN:
                self._rescan = True
            elif action is not _Action.IGNORE:
                self._pending.add(path)
                moved = True
        return moved

    def _walk_from_scratch(self) -> None:
        self._cost.rescans += 1
        self._candidates.clear()
        self._by_pid.clear()
        self._unasked.clear()
        self._gap_counts.clear()
        self._moves.clear()
        self._regroup = True
        self._errors.clear()
        self._gaps_changed = True
        self._error_bytes = 0
        self._pending.clear()
        self._listings.clear()
        self._scan(os.path.join(self._home, _RUNS), (_RUNS,))
        if self._runtime_is_real():
            self._scan(os.path.join(self._home, *_EXEC_PARTS), _EXEC_PARTS)
        self._read_servers()
        self._rescan = False

    def _runtime_is_real(self) -> bool:
        """Whether ``runtime`` is no symlink: what is below a link is never read.

        A link there is an error for its path (a gap), as a linked ``runs`` is.
        """
        path = os.path.join(self._home, _EXEC_PARTS[0])
        try:
            linked = stat.S_ISLNK(os.lstat(path).st_mode)
        except OSError:
            linked = False
        if linked:
            self._set_error(path, "is a symbolic link; not followed", None, None)
            return False
        self._clear_error(path)
        return True

    def _apply(self, path: str) -> None:
        """Bring one pending path up to date (the original ``reconcile``)."""
        parts = self._parts(path)
        action = _action(parts)
        if action is _Action.SERVERS:
            self._read_servers()
        elif action is _Action.RESCAN:
            self._rescan = True
        elif self._through_symlink(path):  # a walk would not have gone there either
            self._forget(path)
            self._drop_under(path)
        elif action in (_Action.PROVIDER_CLIENT, _Action.EXEC):
            kind = _Kind.EXEC if action is _Action.EXEC else _Kind.PROVIDER_CLIENT
            self._read_receipt(path, kind)
        elif action is _Action.WALK and parts is not None:
            self._relist(path, parts)

    def _relist(self, path: str, parts: _Parts) -> None:
        """List a walked directory from scratch.

        What it no longer holds (a directory renamed away and another put in
        its place) is dropped; what it holds again is kept as it was, so a
        listing that finds nothing new changes nothing (nor counts as a change).
        """
        self._listings.forget_under(path)  # listed again below, where still there
        prefix = path + os.sep
        key_prefix = self._key(prefix)
        keys = [key for key in self._candidates if key.startswith(key_prefix)]
        errors = [known for known in self._errors if known == path or known.startswith(prefix)]
        self._seen = set()
        try:
            self._scan(path, parts)
        finally:
            seen, self._seen = self._seen, None
        for key in keys:
            if os.path.join(self._home, key) not in seen:
                self._drop(key)
        for known in errors:
            if known not in seen:
                self._clear_error(known)

    def _through_symlink(self, path: str) -> bool:
        """Whether a directory between the home and ``path`` is a symlink.

        A watcher may follow symlinks and report paths below them; the walk
        never does, so neither does a pending read.
        """
        parent = os.path.dirname(path)
        linked = self._linked_dirs.get(parent)
        if linked is None:
            linked = self._linked_dirs[parent] = os.path.realpath(parent) != parent
        return linked

    def _recheck_all(self) -> None:
        """Step 2 without a trusted watcher: ``stat``-check every candidate and errored receipt."""
        receipts = [path for path, error in self._errors.items() if error.kind is not None]
        candidates = [os.path.join(self._home, key) for key in self._candidates]
        for path in [*candidates, *receipts]:  # a path is in one of the two
            self._recheck(path)
        self._recheck_servers()

    def _moved(self, version: StoreVersion) -> bool:
        """Step 4: did candidates, ownership or the file system move during the observation?

        Ownership moved when the store's version is not the one taken before
        it was asked; candidates moved when (without a trusted watcher) the
        ``stat`` check changes anything, against the same sample.
        """
        moved = False
        if not self.trust_watcher:
            before = self._mutations
            self._recheck_all()
            moved = self._mutations != before
        moved |= self.ownership.version() != version
        moved |= self._take_changes()  # a rescan owed is reported apart: catching up
        return moved

    # ----------------------------------------------------------------------
    # The cache's candidates: every change goes through _put and _drop

    def _put(self, key: str, candidate: _Candidate) -> None:
        """Make ``candidate`` the one at ``key`` (its path under the home).

        A re-read that parsed the same keeps the old one (and its place in the answer).
        """
        old = self._candidates.get(key)
        if old is not None and old.same(candidate):
            old.signature = candidate.signature
            return
        if old is not None:
            self._drop(key)
        self._mutations += 1
        self._candidates[key] = candidate
        self._by_pid.setdefault(candidate.pid, {})[key] = None
        if candidate.gap is not None:
            self._gap_counts[candidate.gap] = self._gap_counts.get(candidate.gap, 0) + 1
            self._gaps_changed = True
        else:
            self._unasked.add(key)

    def _drop(self, key: str) -> None:
        candidate = self._candidates.pop(key, None)
        if candidate is None:
            return
        self._mutations += 1
        pid = candidate.pid
        keys = self._by_pid[pid]
        del keys[key]
        if not keys:
            del self._by_pid[pid]
        if candidate.gap is not None:
            self._gaps_changed = True
            count = self._gap_counts[candidate.gap] - 1
            if count:
                self._gap_counts[candidate.gap] = count
            else:
                del self._gap_counts[candidate.gap]
        elif key in self._unasked:
            self._unasked.discard(key)
        elif candidate.process is not None:
            self._move(candidate.owner, candidate.process, added=False)

    def _move(self, owner: str | None, process: SessionProcess, *, added: bool) -> None:
        if self._regroup:
            return
        removed_list, added_list = self._moves.setdefault(owner, ([], []))
        (added_list if added else removed_list).append(process)

    # ----------------------------------------------------------------------
    # Ownership (docs/design.md §5 step 3)

    def _refresh_ownership(self, version: StoreVersion) -> None:
        """Ask the store about what it was not asked yet, or everything if it changed."""
        sample = self._sample
        # Versions of two store readers (connections) are not comparable.
        everything = version != self._store_version or self.ownership is not self._asked_of
        if everything:
            paths: list[str] = [p for p, c in self._candidates.items() if c.gap is None]
            pids: list[int] = list(sample)
        else:
            paths = sorted(self._unasked)
            pids = [pid for pid in sample if pid not in self._asked_pids]
        if not (everything or paths or pids):
            return
        inputs: list[str] = []
        execs: list[str] = []
        for path in paths:
            candidate = self._candidates[path]
            (execs if candidate.kind is _Kind.EXEC else inputs).append(candidate.key)
        answer = self.ownership.session_process_ownership(inputs, execs, pids)
        if everything:
            self._rows = {}
            self._contexts_changed |= answer.contexts != self._contexts
            self._gaps_changed |= answer.gaps != self._ownership_gaps
            self._contexts = {}
            self._ownership_gaps = answer.gaps
        self._asked_pids = set(sample)
        for pid in [pid for pid in self._rows if pid not in sample]:
            del self._rows[pid]
        self._rows.update(answer.processes)
        self._contexts.update(answer.contexts)
        self._assign(paths, answer)
        if not self._unasked:
            self._unasked = set()  # a set does not shrink as it empties
        self._store_version = version
        self._asked_of = self.ownership

    def _assign(self, keys: list[str], answer: Ownership) -> None:
        """Set the owners of the candidates at ``keys``; record how the groups move."""
        for key in keys:
            candidate = self._candidates[key]
            by_key = answer.execs if candidate.kind is _Kind.EXEC else answer.inputs
            owner = by_key.get(candidate.key)
            if owner is not None:
                owner = sys.intern(owner)  # one string per session, not per receipt
            if key in self._unasked:
                self._unasked.discard(key)
            elif owner == candidate.owner:
                continue
            elif candidate.process is not None:
                self._move(candidate.owner, candidate.process, added=False)
            candidate.owner = owner
            if candidate.process is not None:
                self._move(owner, candidate.process, added=True)

    # ----------------------------------------------------------------------
    # Projection (docs/design.md §5 step 3)

    def _project(self) -> _Answer:
        """The answer's lists; the previous ones, where nothing they rest on changed.

        Lists are never changed in place once answered (earlier snapshots
        and their encoded bytes keep them): a changed list is a new one.
        """
        dirty = self._regroup_all() if self._regroup else self._apply_moves()
        if self._contexts_changed:
            dirty.update(self._groups)
            dirty.add("")  # the session list is built again even if no group remains
            self._contexts_changed = False
        owned_processes = self._owned_processes()
        servers = self._live_servers(self._sample)
        previous = self._answer
        if previous is None:
            previous = _Answer([], [], [], [], {}, {})
        elif (
            not dirty
            and owned_processes == previous.owned_processes
            and servers == previous.servers
            and not self._gaps_changed
        ):
            return previous
        sessions, by_id = self._sessions(previous, dirty, owned_processes)
        unowned = self._groups.get(None)
        if unowned is None:
            unowned = previous.unowned if not previous.unowned else []
        if self._gaps_changed or self._answer is None:
            gaps = [
                *(() if self._identity is not None else (self._missing_home_gap(),)),
                *self._ownership_gaps,
                *sorted(self._gap_counts),
                *(f"{path}: {self._errors[path].message}" for path in sorted(self._errors)),
            ]
        else:
            gaps = previous.gaps
        self._gaps_changed = False
        if servers == previous.servers:
            servers = previous.servers
        self._answer = _Answer(sessions, unowned, servers, gaps, owned_processes, by_id)
        return self._answer

    def _owned_processes(self) -> dict[str, list[SessionProcess]]:
        """session id → the sampled processes it owns by (pid, start time) rows."""
        owned: dict[str, list[SessionProcess]] = {}
        for pid, rows in self._rows.items():
            for started_at, session_id in rows:
                if matches_start(self._sample, pid, started_at, PROCESS_TOLERANCE_S):
                    owned.setdefault(session_id, []).append(
                        SessionProcess(kind="process", pid=pid, started_at=started_at)
                    )
        return owned

    def _sessions(
        self,
        previous: _Answer,
        dirty: set[str | None],
        owned_processes: dict[str, list[SessionProcess]],
    ) -> tuple[list[Session], dict[str, Session]]:
        """The sessions, rebuilding only the dirty ones; the previous list if none was."""
        sessions: list[Session] = []
        by_id: dict[str, Session] = {}
        owners = {owner for owner in self._groups if owner is not None}
        for session_id in sorted(owners | owned_processes.keys()):
            processes = owned_processes.get(session_id)
            session = previous.by_id.get(session_id)
            context = self._contexts.get(session_id)
            if (
                session is None
                or session_id in dirty
                or session.context_id != context  # a session active through rows alone too
                or processes != previous.owned_processes.get(session_id)
            ):
                listed = self._groups.get(session_id, [])
                if processes:
                    listed = sorted([*listed, *processes], key=_order)
                session = Session(session_id, context, listed)
            sessions.append(session)
            by_id[session_id] = session
        if len(sessions) == len(previous.sessions) and all(
            new is old for new, old in zip(sessions, previous.sessions, strict=True)
        ):
            return previous.sessions, previous.by_id
        return sessions, by_id

    def _regroup_all(self) -> set[str | None]:
        """Every group from the candidates, sorted; returns the owners (all dirty)."""
        groups: dict[str | None, list[SessionProcess]] = {}
        for candidate in self._candidates.values():
            if candidate.process is not None and candidate.owner is not _UNASKED:
                groups.setdefault(candidate.owner, []).append(candidate.process)
        for processes in groups.values():
            processes.sort(key=_order)
        dirty = {*self._groups, *groups, ""}
        self._groups = groups
        self._moves.clear()
        self._regroup = False
        return dirty

    def _apply_moves(self) -> set[str | None]:
        """Update the groups the moves touched (copies: earlier answers keep theirs)."""
        dirty: set[str | None] = set()
        for owner, (removed, added) in self._moves.items():
            if sorted(removed, key=_order) == sorted(added, key=_order):
                continue  # came back the same
            processes = list(self._groups.get(owner, ()))
            for process in removed:
                at = bisect.bisect_left(processes, _order(process), key=_order)
                while at < len(processes) and processes[at] is not process:
                    at += 1
                if at == len(processes):  # not where it should be: build every group again
                    return self._regroup_all()
                del processes[at]
            for process in added:
                bisect.insort(processes, process, key=_order)
            if processes:
                self._groups[owner] = processes
            else:
                self._groups.pop(owner, None)
            dirty.add(owner)
        self._moves.clear()
        return dirty

    def _live_servers(self, sample: ProcessSample) -> list[ServerEntry]:
        live = []
        for entry in self._servers:
            if entry.opencode_pid not in sample or (
                entry.started_at is not None
                and not matches_start(
                    sample, entry.opencode_pid, entry.started_at, SERVER_TOLERANCE_S
                )
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

    # ----------------------------------------------------------------------
    # The home

    def _stat_home(self) -> tuple[int, int] | None:
        """The home's identity (device, inode), or None while it is missing.

        The home is looked up by the path it was given (symlinks followed), not
        by the path they resolved to: a symlink removed, or replaced by a
        directory, replaces the home even though its old target still exists.

        Raises:
            _Unavailable: the home is refused (docs/design.md §3 strictness); the gap is
                :func:`~capsuled.home.home_refusal`'s text, the same as at start.
            OSError: the home cannot be inspected.
        """
        try:
            st = os.stat(self._home if self._alias is None else self._alias)
        except FileNotFoundError:
            return None
        refusal = home_refusal(st, self._home, self._uid)
        if refusal is not None:
            raise _Unavailable(refusal)
        return st.st_dev, st.st_ino

    def _missing_home_gap(self) -> str:
        return f"home {self._home} does not exist; no receipts are read until it is created"

    def _check_home(self) -> None:
        """Home identity and strictness (docs/design.md §3 strictness, §5 home identity)."""
        try:
            identity = self._stat_home()
        except OSError as exc:
            raise _Unavailable(f"home {self._home} cannot be inspected: {_describe(exc)}") from exc
        if self._identity is not None and identity != self._identity:
            raise _HomeReplaced
        if self._identity is None and identity is not None:
            # The home (re)appeared: a walk of the missing home found nothing, and
            # a watch may not see the new one yet. Walk it now, whatever the watcher says.
            self._rescan = True
        if (identity is None) != (self._identity is None):
            self._gaps_changed = True  # the missing-home gap comes or goes
        self._identity = identity

    def _unalias(self, path: str) -> str:
        alias = self._alias
        if alias is not None and (path == alias or path.startswith(alias + os.sep)):
            return self._home + path[len(alias) :]
        return path

    def _parts(self, path: str) -> _Parts | None:
        if path == self._home:
            return ()
        prefix = self._home + os.sep
        if not path.startswith(prefix):
            return None
        return tuple(path[len(prefix) :].split(os.sep))

    # ----------------------------------------------------------------------
    # Walking and reading

    def _check_cancelled(self) -> None:
        if self._cancel.is_set():
            raise ObservationCancelled("active session observation cancelled")

    def _scan(self, path: str, parts: _Parts) -> None:
        """List a directory of the receipt places, never through a link (the original ``scan``)."""
        self._check_cancelled()
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "a symbolic link", path)
            entries = os.scandir(path)
        except (FileNotFoundError, NotADirectoryError):
            self._drop_under(path)
            if parts in ((_RUNS,), _EXEC_PARTS) and os.path.islink(path):
                self._set_error(path, "is a symbolic link; not followed", None, None)
            return
        except OSError as exc:
            self._set_error(path, f"cannot list directory: {_describe(exc)}", None, None)
            return
        self._cost.directories += 1
        self._clear_error(path)
        names: dict[str, int] = {}
        with entries:
            try:
                for entry in entries:
                    child = (*parts, entry.name)
                    if _action(child) is not _Action.IGNORE:
                        names[entry.name] = entry.inode()
                    self._visit(entry, child)
            except OSError as exc:
                self._set_error(path, f"cannot list directory: {_describe(exc)}", None, None)
                return
        self._listings.record(path, st, names)

    def _visit(self, entry: os.DirEntry[str], parts: _Parts) -> None:
        if entry.name.startswith("."):
            return
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        kind = _receipt_kind(parts)
        if is_dir and kind is None:
            if _walked(parts):
                self._scan(entry.path, parts)
            return
        # A receipt's place holds whatever it holds: a directory named x.json
        # is an error for that path, as it is when the watcher reports it.
        if kind is not None:
            self._read_receipt(entry.path, kind)

    def _key(self, path: str) -> str:
        """The candidate key of an absolute path under the home."""
        return path[len(self._home) + 1 :]

    def _drop_under(self, path: str) -> None:
        self._listings.forget_under(path)
        prefix = path + os.sep
        key_prefix = self._key(prefix) if path != self._home else ""
        for key in [k for k in self._candidates if k.startswith(key_prefix)]:
            self._drop(key)
        for key in [k for k in self._errors if k == path or k.startswith(prefix)]:
            self._clear_error(key)

    def _forget(self, path: str) -> None:
        self._drop(self._key(path))
        self._clear_error(path)

    def _read_receipt(self, path: str, kind: _Kind) -> None:
        """Read, parse and judge one receipt; a failure is an error for its path, never raised."""
        self._check_cancelled()
        self._cost.receipts += 1
        if self._seen is not None:
            self._seen.add(path)
        read_ns = time.time_ns()
        try:
            loaded = self._load(path)
            if loaded is None:
                self._forget(path)
                return
            data, st = loaded
            receipt: Receipt = (
                decode_exec_receipt(data)
                if kind is _Kind.EXEC
                else decode_provider_client_receipt(data)
            )
        except ReceiptError as exc:
            self._drop(self._key(path))
            self._set_error(path, str(exc), kind, self._error_signature(path, read_ns))
            return
        self._clear_error(path)
        key = self._key(path)
        input_dir = os.path.dirname(os.path.dirname(path))
        signature = self._signature(st, read_ns)
        candidate = _candidate(key, kind, receipt, signature, input_dir, self._numbers)
        if candidate.live(self._sample):
            self._put(key, candidate)
        else:
            self._drop(key)

    @staticmethod
    def _error_signature(path: str, read_ns: int) -> _Signature | None:
        """The signature of a receipt that failed, taken after the attempt.

        Taken after, not before (the open's own ``fstat`` is the signature of
        what a good read read): a write after the attempt leaves a timestamp
        inside the racy window, which makes the signature unstable, so the
        next check reads it again instead of trusting it.
        """
        try:
            return _Signature.of(os.lstat(path), read_ns)
        except OSError:
            return None

    def _signature(self, st: os.stat_result, read_ns: int) -> _Signature | None:
        """What a later ``stat`` check compares (verification; each observation without a watch)."""
        return _Signature.of(st, read_ns)

    def _load(self, path: str) -> tuple[bytes, os.stat_result] | None:
        """Open without following symlinks or blocking; check type, owner and size; read.

        Returns None when the path no longer exists.

        Raises:
            ReceiptError: a symlink, not a regular file, another user's file,
                larger than 64 KiB, or unreadable.
        """
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ReceiptError("is a symbolic link; receipts are not followed") from exc
            raise ReceiptError(f"cannot open receipt: {_describe(exc)}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ReceiptError("not a regular file")
            if st.st_uid != self._uid:
                raise ReceiptError(
                    f"owned by uid {st.st_uid}, not {self._uid}; another user's receipt is refused"
                )
            if st.st_size > MAX_RECEIPT_BYTES:
                raise ReceiptError(f"{st.st_size} bytes, larger than {MAX_RECEIPT_BYTES}")
            data = _read_at_most(fd, MAX_RECEIPT_BYTES + 1)
        except OSError as exc:
            raise ReceiptError(f"cannot read receipt: {_describe(exc)}") from exc
        finally:
            os.close(fd)
        if len(data) > MAX_RECEIPT_BYTES:
            raise ReceiptError(f"larger than {MAX_RECEIPT_BYTES} bytes")
        self._cost.bytes += len(data)
        return data, st

    def _recheck(self, path: str) -> None:
        """Re-read a candidate or errored receipt, or trust ``lstat`` if nothing changed."""
        candidate = self._candidates.get(self._key(path))
        error = self._errors.get(path)
        kind = candidate.kind if candidate is not None else error.kind if error else None
        if kind is None:
            return
        signature = (
            candidate.signature if candidate is not None else error.signature if error else None
        )
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            self._forget(path)
            return
        except OSError:
            st = None
        if st is not None and signature is not None and signature.unchanged(st):
            if candidate is not None and not candidate.live(self._sample):
                self._drop(self._key(path))
            return
        self._read_receipt(path, kind)

    def _read_servers(self) -> None:
        path = os.path.join(self._home, *_SERVERS_PARTS)
        self._check_cancelled()
        self._cost.receipts += 1
        if self._seen is not None:
            self._seen.add(path)
        read_ns = time.time_ns()
        try:
            loaded = self._load(path) if self._runtime_is_real() else None
            if loaded is None:
                self._servers, self._servers_signature = [], None
                self._clear_error(path)
                return
            data, st = loaded
            self._servers = decode_servers_registry(data)
            self._servers_signature = _Signature.of(st, read_ns)
            self._clear_error(path)
        except ReceiptError as exc:
            self._servers, self._servers_signature = [], None
            self._set_error(path, str(exc), None, None)

    def _recheck_servers(self) -> None:
        path = os.path.join(self._home, *_SERVERS_PARTS)
        signature = self._servers_signature
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if signature is None and path not in self._errors:
                return
            st = None
        except OSError:
            st = None
        if st is not None and signature is not None and signature.unchanged(st):
            return
        self._read_servers()

    # ----------------------------------------------------------------------
    # Errors (bounded, docs/design.md §5)

    def _set_error(
        self, path: str, message: str, kind: _Kind | None, signature: _Signature | None
    ) -> None:
        if self._seen is not None:
            self._seen.add(path)
        error = self._errors.get(path)
        if error is not None and error.message == message:
            error.kind, error.signature = kind, signature
            return
        self._clear_error(path)
        self._mutations += 1
        self._gaps_changed = True
        self._errors[path] = _Error(message, kind, signature)
        self._error_bytes += _error_size(path, message)
        if len(self._errors) > MAX_ERRORS or self._error_bytes > MAX_ERROR_BYTES:
            raise _Unavailable(GAP_TOO_MANY_ERRORS)

    def _clear_error(self, path: str) -> None:
        error = self._errors.pop(path, None)
        if error is not None:
            self._mutations += 1
            self._gaps_changed = True
            self._error_bytes -= _error_size(path, error.message)


def _older_than(path: str, moment_ns: int) -> bool:
    """Whether the entry at ``path`` last changed before ``moment_ns`` (gone: yes)."""
    while True:
        try:
            st = os.lstat(path)
            break
        except OSError:  # gone: when the nearest directory still there last changed says when
            parent = os.path.dirname(path)
            if parent == path:
                return True
            path = parent
    return max(st.st_mtime_ns, st.st_ctime_ns) < moment_ns


def _error_size(path: str, message: str) -> int:
    return len(os.fsencode(path)) + len(message.encode())


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _order(process: SessionProcess) -> tuple[str, int, int, str, str, str]:
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
