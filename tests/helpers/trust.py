"""A real daemon on a home under adversity, and the check that it is neither deaf nor wrong.

The adversity tests (``tests/integration/watch/test_trust*.py``) build links,
cycles, odd files, renames and kernel limits into a home served by the real
``capsuled``; after each one, :meth:`Trusted.check` writes receipts for a live
``sleep`` into every real receipt directory of the home and into a new run,
registers a new session that owns some of them, and asserts that

* a plain ``sessions.snapshot`` shows them within the watch's latency
  (:data:`WATCH_LATENCY_S`): the watch still hears, the store's write too;
* the next ``sessions.snapshot {"max_age_ms": 0}`` shows them too
  (read-your-writes), ``ready``;
* both answers list exactly the receipts the test wrote into real
  directories, each once, at its real path, under the session that owns it:
  nothing is seen through a link;
* the watch still runs in the mode it was started in, and the directories it
  watches (or polls) are exactly the real directories the home's layout
  enters, counted here by an ``lstat`` walk that shares no code with the
  daemon (docs/design.md §2, §8 "The watch").
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TypeVar

import msgspec

from capsule_client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import (
    ExecReceipt,
    ProviderClientReceipt,
    process_start_time,
    write_exec_receipt,
    write_provider_client_receipt,
)
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    VerificationStatus,
    WatchStatus,
)
from helpers.daemon import DaemonProcess
from helpers.waits import wait_until

T = TypeVar("T")

#: Both watch modes; every adversity case runs in each.
MODES: Final = ("native", "polling")
#: How long a receipt written into a real directory may take to reach a plain answer.
WATCH_LATENCY_S: Final = 2.0
#: ``--poll-interval`` in polling mode: a tenth of the default, to keep the catalogue short.
POLL_INTERVAL_S: Final = 0.1
#: The run and input that always exist as real directories.
REAL_RUN: Final = "r_real"
REAL_INPUT: Final = "inp_real"
EXEC_DIR: Final = ("runtime", "exec-processes")


def receipts_of(answer: ActiveSessionsSnapshot) -> list[str]:
    """Every receipt the answer lists (sessions and unowned), sorted; duplicates kept."""
    processes = [*(p for s in answer.sessions for p in s.processes), *answer.unowned]
    return sorted(p.receipt for p in processes if isinstance(p.receipt, str))


def owners_of(answer: ActiveSessionsSnapshot) -> dict[str, str | None]:
    """Each receipt the answer lists → the session it is listed under (None: unowned)."""
    owners: dict[str, str | None] = {}
    for session in answer.sessions:
        owners.update({p.receipt: session.session_id for p in session.processes if p.receipt})
    owners.update({p.receipt: None for p in answer.unowned if isinstance(p.receipt, str)})
    return owners


def pid_of(answer: ActiveSessionsSnapshot, receipt: str) -> int | None:
    """The pid the answer lists for ``receipt`` (a path relative to the home), if any."""
    processes = [*(p for s in answer.sessions for p in s.processes), *answer.unowned]
    return next((p.pid for p in processes if p.receipt == receipt), None)


def receipt_bytes(relative: str, pid: int, started_at_s: float) -> bytes:
    """A valid receipt of the kind its path (relative to the home) says, for ``pid``."""
    if relative.startswith("runtime/"):
        exec_id = Path(relative).stem
        exec_receipt = ExecReceipt(
            schema_version=1, exec_id=exec_id, pid=pid, started_at=round(started_at_s)
        )
        return msgspec.json.encode(exec_receipt)
    started_at = datetime.fromtimestamp(started_at_s, tz=UTC)
    client = ProviderClientReceipt(schema_version=1, pid=pid, started_at=started_at)
    return msgspec.json.encode(client)


def _is_real_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _real_children(path: Path) -> list[Path]:
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    return [path / n for n in names if not n.startswith(".") and _is_real_directory(path / n)]


def walked_directories(home: Path) -> int:
    """Real directories a walk lists: ``runs`` and three levels below, ``provider-clients``
    below an input, ``runtime/exec-processes``; never through a link."""
    count = 0
    runtime = home / "runtime"
    if _is_real_directory(runtime) and _is_real_directory(runtime / "exec-processes"):
        count += 1
    runs = home / "runs"
    if not _is_real_directory(runs):
        return count
    count += 1
    for run in _real_children(runs):
        count += 1
        for input_dir in _real_children(run):
            count += 1
            if _is_real_directory(input_dir / "provider-clients"):
                count += 1
    return count


def entered_directories(home: Path) -> int:
    """Real directories the watch enters: the walked ones, the home and ``runtime``."""
    return 1 + int(_is_real_directory(home / "runtime")) + walked_directories(home)


def links_under(root: Path) -> list[Path]:
    """Every symbolic link below ``root`` (never followed), deepest first."""
    found: list[Path] = []
    for directory, names, files in os.walk(root):  # os.walk does not follow links
        found.extend(
            Path(directory, n) for n in [*names, *files] if Path(directory, n).is_symlink()
        )
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def settles(
    fetch: Callable[[], T], wanted: Callable[[T], bool], *, timeout_s: float, what: str
) -> T:
    """Fetch until ``wanted`` holds; fail after ``timeout_s`` showing the last value fetched."""
    last: list[T] = []

    def holds() -> bool:
        last[:] = [fetch()]
        return wanted(last[0])

    try:
        wait_until(holds, timeout_s=timeout_s, message=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {last[0] if last else None!r}") from None
    return last[0]


class Trusted:
    """A home with real receipt directories, a live ``sleep``, and the daemon serving it.

    Args:
        root: a short directory; the home is ``root/home``, and ``root/outside``
            is a place outside the home for link targets.
        sleeper: a live process the receipts point at.
        mode: ``native`` or ``polling``.
        args: more daemon arguments.

    Attributes:
        expected: the receipts (paths relative to the home) that every answer
            must list, each once; the test adds what it writes into real
            directories for live processes, and removes what it kills or moves.
        input_owners: input id → the session the test registered as its owner.
        exec_owners: exec id → the session the test registered as its owner.
        limited: the native watch may poll directories it could not watch.
    """

    def __init__(
        self,
        root: Path,
        sleeper: subprocess.Popen[bytes],
        mode: str,
        args: Sequence[str] = (),
        daemon_class: type[DaemonProcess] = DaemonProcess,
    ) -> None:
        self.root = root
        self.home = root / "home"
        self.outside = root / "outside"
        self.mode = mode
        self.sleeper = sleeper
        self.started_at_s = process_start_time(sleeper.pid)
        self.expected: set[str] = set()
        self.input_owners: dict[str, str] = {}
        self.exec_owners: dict[str, str] = {}
        self.probes = 0
        self.limited = False
        for directory in (
            self.home / "runs" / REAL_RUN / REAL_INPUT / "provider-clients",
            self.home.joinpath(*EXEC_DIR),
            self.home / "sessions",
            self.outside,
        ):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
        polling = ["--poll-interval", str(POLL_INTERVAL_S)] if mode == "polling" else []
        self.daemon = daemon_class(
            self.home, root / "t.sock", ["--watch", mode, "--log-level", "info", *polling, *args]
        )
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        assert self._client is not None, "the daemon is not started"
        return self._client

    def start(self) -> None:
        """Start the daemon and wait for its first ``ready`` answer."""
        self.daemon.start()
        self._client = Client(self.daemon.socket_path)
        answer = self.client.snapshot(max_age_ms=0)
        assert answer.discovery == "ready", answer.gaps

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self.daemon.__exit__()

    # ------------------------------------------------------------------
    # Writing receipts

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.home))

    def exec_receipt(self, exec_id: str, *, home: Path | None = None, pid: int = 0) -> Path:
        """An exec receipt for ``pid`` (the sleeper by default); expected when in the home."""
        path = write_exec_receipt(
            home or self.home,
            exec_id,
            pid or self.sleeper.pid,
            started_at_s=self.started_at_s if not pid else None,
        )
        if home is None:
            self.expected.add(self.relative(path))
        return path

    def client_receipt(
        self, run: str, input_id: str, client: str, *, home: Path | None = None, pid: int = 0
    ) -> Path:
        """A provider-client receipt for ``pid`` (the sleeper); expected when in the home."""
        path = write_provider_client_receipt(
            home or self.home,
            run,
            input_id,
            client,
            pid or self.sleeper.pid,
            started_at_s=self.started_at_s if not pid else None,
        )
        if home is None:
            self.expected.add(self.relative(path))
        return path

    def forget_under(self, relative: str) -> None:
        """The receipts below ``relative`` are no longer expected (moved away, removed)."""
        self.expected = {r for r in self.expected if not r.startswith(relative + "/")}

    # ------------------------------------------------------------------
    # The check

    def owner(self, receipt: str) -> str | None:
        """The session that owns ``receipt`` (a path relative to the home), by its id."""
        parts = Path(receipt).parts
        if parts[0] == "runs":
            return self.input_owners.get(parts[2])
        return self.exec_owners.get(Path(receipt).stem)

    def own(
        self, session_id: str, *, inputs: Sequence[str] = (), execs: Sequence[str] = ()
    ) -> None:
        """Register a session and what it owns in the store, as a runtime would."""
        with OwnershipStore(store_path(self.home)) as store:
            store.register_session(session_id, context_id=f"ctx_{session_id}")
            for input_id in inputs:
                store.register_input(input_id, session_id)
                self.input_owners[input_id] = session_id
            for exec_id in execs:
                store.register_exec(exec_id, session_id)
                self.exec_owners[exec_id] = session_id

    def exact(self, answer: ActiveSessionsSnapshot) -> bool:
        """``ready``, listing each expected receipt once, under the session that owns it."""
        return (
            answer.discovery == "ready"
            and receipts_of(answer) == sorted(self.expected)
            and owners_of(answer) == {r: self.owner(r) for r in self.expected}
        )

    def plain(self, what: str = "the receipts") -> ActiveSessionsSnapshot:
        """A plain answer listing exactly :attr:`expected`, within the watch's latency."""
        return settles(self.client.snapshot, self.exact, timeout_s=WATCH_LATENCY_S, what=what)

    def fresh(self) -> ActiveSessionsSnapshot:
        """The next read-your-writes answer; it must list exactly :attr:`expected`."""
        answer = self.client.snapshot(max_age_ms=0)
        assert answer.discovery == "ready", answer.gaps
        assert receipts_of(answer) == sorted(self.expected), answer
        assert owners_of(answer) == {r: self.owner(r) for r in self.expected}, answer
        return answer

    def watch(self) -> WatchStatus:
        watch = self.client.status().watch
        assert watch is not None
        return watch

    def walk(self) -> DiscoveryCost:
        """The cost of a walk from scratch (``reader.rescan``), read from that walk's own answer.

        ``status`` counts the walk and shows the latest answer's cost in one
        piece; where a later observation (woken by anything) came first, its
        cost is not the walk's, so the walk is asked for again.
        """
        for _ in range(10):
            rescans = self.client.status().totals.rescans
            self.client.rescan()
            status = wait_until(
                lambda rescans=rescans: (s := self.client.status()).totals.rescans > rescans and s,
                message="the rescan",
            )
            if status.last_cost is not None and status.last_cost.rescans == 1:
                return status.last_cost
        raise AssertionError("every walk's answer was replaced before it could be read")

    def verification(self) -> VerificationStatus:
        verification = self.client.status().verification
        assert verification is not None
        return verification

    def check_directories(self) -> WatchStatus:
        """The watch runs in its mode and covers exactly the real entered directories.

        A native watch watches every one of them, or (where :attr:`limited`,
        at the watch limit) watches some and polls the rest.
        """

        def covers(watch: WatchStatus) -> bool:
            entered = entered_directories(self.home)
            if self.mode == "native":
                covered = watch.watched_directories + watch.polled_directories
                return (
                    (watch.mode, watch.backend) == ("native", "inotify")
                    and covered == entered
                    and (self.limited or watch.polled_directories == 0)
                )
            return (watch.mode, watch.backend) == (
                "polling",
                "lstat",
            ) and watch.polled_directories == entered

        return settles(
            self.watch, covers, timeout_s=WATCH_LATENCY_S, what="the watch to cover the home"
        )

    def real(self, relative: str) -> bool:
        """Whether every component of ``relative`` below the home is a real directory."""
        path = self.home
        for part in Path(relative).parts:
            path = path / part
            if not _is_real_directory(path):
                return False
        return True

    def probe(self, name: str) -> None:
        """Receipts for the sleeper in every real receipt directory, a new run, a store write.

        A receipt in each real ``provider-clients`` directory of the home, one in
        the exec directory, and one in a new run; a new session in the store
        owns the new run's input and the new exec receipt (a store write is a
        change in the home itself).
        """
        wrote = False
        if self.real("runs"):
            for clients in sorted((self.home / "runs").glob("*/*/provider-clients")):
                run, input_id = clients.parts[-3:-1]
                if self.real(f"runs/{run}/{input_id}/provider-clients"):
                    self.client_receipt(run, input_id, name)
            self.client_receipt(f"r_{name}", f"inp_{name}", "c1")
            wrote = True
        if self.real("/".join(EXEC_DIR)):
            self.exec_receipt(f"exe_{name}")
            wrote = True
        assert wrote, "nowhere to probe"
        self.own(f"ses_{name}", inputs=[f"inp_{name}"], execs=[f"exe_{name}"])

    def check(self) -> ActiveSessionsSnapshot:
        """Neither deaf nor wrong: new receipts in real directories are seen, and only they.

        Returns:
            the read-your-writes answer.
        """
        self.probes += 1
        # Heard by the watch: a plain answer, within the watch's latency.
        self.probe(f"heard{self.probes}")
        self.plain(f"probe {self.probes} in a plain answer")
        # Read-your-writes: the very next answer with max_age_ms 0.
        self.probe(f"fresh{self.probes}")
        answer = self.fresh()
        self.check_directories()
        return answer


@contextmanager
def trusted(
    root: Path,
    sleeper: subprocess.Popen[bytes],
    mode: str,
    args: Sequence[str] = (),
    *,
    before_start: Callable[[Trusted], None] | None = None,
    daemon_class: type[DaemonProcess] = DaemonProcess,
) -> Iterator[Trusted]:
    """A started :class:`Trusted`; ``before_start`` runs on its home before the daemon starts."""
    home = Trusted(root, sleeper, mode, args, daemon_class)
    try:
        if before_start is not None:
            before_start(home)
        home.start()
        yield home
    finally:
        home.close()
