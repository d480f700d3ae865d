"""The candidates: receipts that parsed and were live at their last read, indexed by pid.

Every change to the candidates goes through :meth:`Candidates.put` and
:meth:`Candidates.drop`, which keep the pid index (liveness is judged again
only for the pids a new sample shows gone or reused), the count of each
candidate gap, the keys whose ownership is not asked yet, and the journal of
receipt processes that came to or went from an owner, which the projection
consumes (docs/design.md §5 steps 2-3).
"""

from __future__ import annotations

import os
import sys
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from dataclasses import dataclass
from typing import Final, TypeAlias

import msgspec

from capsule_client.kit.receipts import (
    EXEC_RECEIPT_TOLERANCE_S,
    PROVIDER_CLIENT_TOLERANCE_S,
    ExecReceipt,
    ProviderClientReceipt,
    is_valid_input_id,
)
from capsule_client.wire import SessionProcess
from capsuled.home.layout import RACY_WINDOW_NS, Kind
from capsuled.processes.sample import ProcessSample, matches_start

__all__ = [
    "UNASKED",
    "Candidate",
    "Candidates",
    "Moves",
    "Numbers",
    "Receipt",
    "Signature",
    "make_candidate",
    "wire_text",
]

#: The owner of a candidate whose ownership was not asked yet.
UNASKED: Final = "\0unasked"

Receipt: TypeAlias = ProviderClientReceipt | ExecReceipt

#: owner (None: nobody) → (receipt processes removed, receipt processes added).
Moves: TypeAlias = dict[str | None, tuple[list[SessionProcess], list[SessionProcess]]]


@dataclass(frozen=True, slots=True)
class Signature:
    """What ``stat`` says about a file when it was read; ``stable`` if a re-check may trust it."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    stable: bool

    @classmethod
    def of(cls, st: os.stat_result, read_ns: int) -> Signature:
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


class Candidate(msgspec.Struct, gc=False):
    """A receipt that parsed and was live at its last read, projected once.

    The decoded receipt is not kept: ``process`` carries what snapshots list
    (None when the input directory's name is not an input id: then ``gap``
    says so), ``pid``, ``start_s`` (the receipt's start time, Unix
    seconds, unrounded) and, where the receipt has them, ``boot_id`` and
    ``start_ticks`` (its exact identity, docs/design.md §14) decide
    liveness. ``key`` is the input id or exec id asked of the store;
    ``owner`` the session that owns it (None: nobody) once ownership was
    asked, :data:`UNASKED` before. ``signature`` is what a later ``stat``
    check compares.

    Untracked by the garbage collector (``gc=False``): it refers to nothing
    that could refer back to it.
    """

    kind: Kind
    pid: int
    start_s: float
    signature: Signature | None
    process: SessionProcess | None
    key: str
    gap: str | None
    owner: str | None = UNASKED
    boot_id: str | None = None
    start_ticks: int | None = None

    def same(self, other: Candidate) -> bool:
        """Whether ``other`` says what this one says (a re-read of an unchanged receipt)."""
        return (
            self.kind is other.kind
            and self.pid == other.pid
            and self.start_s == other.start_s
            and self.start_ticks == other.start_ticks
            and self.boot_id == other.boot_id
            and self.key == other.key
            and self.gap == other.gap
            and self.process == other.process
        )

    def live(self, sample: ProcessSample) -> bool:
        """Liveness against one sample (docs/design.md §3 "Liveness", §14): exact by
        (boot id, start ticks) where the receipt has them, else within its tolerance."""
        tolerance_s = (
            EXEC_RECEIPT_TOLERANCE_S if self.kind is Kind.EXEC else PROVIDER_CLIENT_TOLERANCE_S
        )
        return matches_start(
            sample,
            self.pid,
            self.start_s,
            tolerance_s,
            boot_id=self.boot_id,
            start_ticks=self.start_ticks,
        )


class Numbers:
    """One object per distinct pid and start time among the candidates.

    Thousands of receipts may name the same few processes; each decoded
    receipt brings its own ``int`` and ``float`` objects, which the candidate
    and its process entry would keep. Sharing them saves memory per retained
    receipt. Emptied at each walk from scratch, so numbers of receipts long
    gone are not kept.
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


def wire_text(text: str) -> str:
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


def make_candidate(
    relative: str,
    kind: Kind,
    receipt: Receipt,
    signature: Signature | None,
    input_dir: str,
    numbers: Numbers,
) -> Candidate:
    """The candidate of a parsed receipt; ``relative`` (its path under the home) is its receipt."""
    pid = numbers.int(receipt.pid)
    # Thousands of receipts name one boot: one string for it.
    boot_id = None if receipt.boot_id is None else sys.intern(receipt.boot_id)
    start_ticks = None if receipt.start_ticks is None else numbers.int(receipt.start_ticks)
    if isinstance(receipt, ExecReceipt):
        started_at = numbers.int(receipt.started_at)
        process = SessionProcess(
            kind="exec",
            pid=pid,
            started_at=started_at,
            exec_id=receipt.exec_id,
            receipt_command=msgspec.UNSET
            if receipt.command is None
            else sys.intern(receipt.command),
            receipt=wire_text(relative),
        )
        return Candidate(
            kind,
            pid,
            started_at,
            signature,
            process,
            receipt.exec_id,
            None,
            boot_id=boot_id,
            start_ticks=start_ticks,
        )
    start_s = numbers.float(receipt.started_at_s)
    input_id = sys.intern(relative.split(os.sep)[2])  # shared by the input's clients
    if not is_valid_input_id(input_id):
        gap = (
            f"{input_dir}: {input_id!r} is not an input id"
            " (inp_ followed by 1-128 of [A-Za-z0-9_-])"
        )
        return Candidate(
            kind,
            pid,
            start_s,
            signature,
            None,
            input_id,
            gap,
            boot_id=boot_id,
            start_ticks=start_ticks,
        )
    process = SessionProcess(
        kind="provider_client",
        pid=pid,
        started_at=numbers.int(round(start_s)),
        input_id=input_id,
        provider=msgspec.UNSET if receipt.provider is None else sys.intern(receipt.provider),
        receipt=wire_text(relative),
    )
    return Candidate(
        kind,
        pid,
        start_s,
        signature,
        process,
        input_id,
        None,
        boot_id=boot_id,
        start_ticks=start_ticks,
    )


class Candidates:
    """The candidates by key (the receipt's path under the home), with their indexes.

    Attributes:
        unasked: keys of candidates whose owner was not asked of the store yet.
        revision: grows at each candidate that came, went or changed.
        gaps_revision: grows at each change to the candidate gaps.
        regroup: the projection must build every group again (after a walk
            from scratch); while set, moves are not journaled.
    """

    def __init__(self) -> None:
        # The key string object is also the process's ``receipt`` (one copy per receipt).
        self._by_key: dict[str, Candidate] = {}
        self._by_pid: dict[int, dict[str, None]] = {}  # pid → candidate keys
        self._gap_counts: dict[str, int] = {}  # candidate gaps (invalid input ids)
        self._moves: Moves = {}
        # (pid, started_at, owner) → the owned candidates naming that process: the
        # sessions' receipt roots of the descendants, kept as owners move.
        self._owned: dict[tuple[int, int, str], int] = {}
        self.unasked: set[str] = set()
        self.revision = 0
        self.gaps_revision = 0
        self.regroup = True

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __getitem__(self, key: str) -> Candidate:
        return self._by_key[key]

    def get(self, key: str) -> Candidate | None:
        return self._by_key.get(key)

    def keys(self) -> KeysView[str]:
        return self._by_key.keys()

    def items(self) -> ItemsView[str, Candidate]:
        return self._by_key.items()

    def values(self) -> ValuesView[Candidate]:
        return self._by_key.values()

    def pids(self) -> KeysView[int]:
        """The pids some candidate names."""
        return self._by_pid.keys()

    def of_pid(self, pid: int) -> list[str]:
        """The keys of the candidates that name ``pid``."""
        return list(self._by_pid.get(pid, ()))

    def gaps(self) -> list[str]:
        """The distinct candidate gaps, sorted."""
        return sorted(self._gap_counts)

    def clear(self) -> None:
        """Forget every candidate (a walk from scratch); the projection regroups."""
        if self._by_key or self._gap_counts:
            self.revision += 1
            self.gaps_revision += 1
        self._by_key.clear()
        self._by_pid.clear()
        self.unasked.clear()
        self._gap_counts.clear()
        self._moves.clear()
        self._owned.clear()
        self.regroup = True

    def put(self, key: str, candidate: Candidate) -> None:
        """Make ``candidate`` the one at ``key``.

        A re-read that parsed the same keeps the old one (and its place in the answer).
        """
        old = self._by_key.get(key)
        if old is not None and old.same(candidate):
            old.signature = candidate.signature
            return
        if old is not None:
            self.drop(key)
        self.revision += 1
        self._by_key[key] = candidate
        self._by_pid.setdefault(candidate.pid, {})[key] = None
        if candidate.gap is not None:
            self._gap_counts[candidate.gap] = self._gap_counts.get(candidate.gap, 0) + 1
            self.gaps_revision += 1
        else:
            self.unasked.add(key)

    def drop(self, key: str) -> None:
        """Forget the candidate at ``key`` (if any)."""
        candidate = self._by_key.pop(key, None)
        if candidate is None:
            return
        self.revision += 1
        pid = candidate.pid
        keys = self._by_pid[pid]
        del keys[key]
        if not keys:
            del self._by_pid[pid]
        if candidate.gap is not None:
            self.gaps_revision += 1
            count = self._gap_counts[candidate.gap] - 1
            if count:
                self._gap_counts[candidate.gap] = count
            else:
                del self._gap_counts[candidate.gap]
        elif key in self.unasked:
            self.unasked.discard(key)
        elif candidate.process is not None:
            self._move(candidate.owner, candidate.process, added=False)

    def drop_under(self, key_prefix: str) -> None:
        """Drop every candidate whose key starts with ``key_prefix``."""
        for key in [k for k in self._by_key if k.startswith(key_prefix)]:
            self.drop(key)

    def set_owner(self, key: str, owner: str | None) -> None:
        """The store answered ``owner`` for the candidate at ``key``; journal the move."""
        candidate = self._by_key[key]
        if key in self.unasked:
            self.unasked.discard(key)
        elif owner == candidate.owner:
            return
        elif candidate.process is not None:
            self._move(candidate.owner, candidate.process, added=False)
        candidate.owner = owner
        if candidate.process is not None:
            self._move(owner, candidate.process, added=True)

    def owned_processes(self) -> dict[tuple[int, int], str]:
        """(pid, started_at) → owner of every owned candidate's process (one owner each)."""
        return {(pid, started_at): owner for pid, started_at, owner in self._owned}

    def take_moves(self) -> Moves:
        """The moves journaled since the last call (emptied)."""
        moves, self._moves = self._moves, {}
        return moves

    def _move(self, owner: str | None, process: SessionProcess, *, added: bool) -> None:
        if owner is not None:
            key = (process.pid, process.started_at, owner)
            count = self._owned.get(key, 0) + (1 if added else -1)
            if count > 0:
                self._owned[key] = count
            else:
                self._owned.pop(key, None)
        if self.regroup:
            return
        removed_list, added_list = self._moves.setdefault(owner, ([], []))
        (added_list if added else removed_list).append(process)
