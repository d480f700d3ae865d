"""The three ways a runtime asks, watched at once: plain snapshots, a long poll, a subscription.

:class:`Asking` runs, beside the test, a subscriber that builds its own state
from ``added`` / ``changed`` / ``removed`` (as a runtime would) and a ``since``
long poll that keeps the latest answer it was given; the test asks plain
``sessions.snapshot`` itself. :meth:`Asking.expect` waits until each of the
three shows what a predicate wants, each within its own deadline, and says
which one did not (docs/design.md §5 "Every path is exact").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec

from capsule_client import Client
from capsule_client.wire import ActiveSessionsSnapshot, Session, SessionProcess

#: How long each path may take to show a change. A lost event or wake-up is
#: repaired only by verification (every 30 s by default), so this still catches
#: one, while a machine loaded by other work may delay an answer past a second:
#: how fast answers change is the benchmarks' to measure, not the suite's.
SHOWN_WITHIN_S = 10.0

#: A process as the views compare it: (kind, pid, started_at, receipt, input or exec id).
Process = tuple[str, int, int, str, str]


def _text(value: str | msgspec.UnsetType) -> str:
    return "" if isinstance(value, msgspec.UnsetType) else value


def process_key(process: SessionProcess) -> Process:
    key = _text(process.input_id) or _text(process.exec_id)
    return (process.kind, process.pid, process.started_at, _text(process.receipt), key)


@dataclass(frozen=True)
class View:
    """What an answer says, in terms every path can be compared in.

    Attributes:
        discovery: ``ready``, ``unavailable`` (or ``scanning``, plain answers only).
        sessions: session id → (context id, its processes sorted).
        unowned: the unowned receipts' processes, sorted.
        gaps: the answer's gaps.
    """

    discovery: str
    sessions: dict[str, tuple[str | None, tuple[Process, ...]]]
    unowned: tuple[Process, ...]
    gaps: tuple[str, ...]

    def owner_of(self, pid: int) -> str | None:
        """The session listing ``pid``, or None."""
        for session_id, (_, processes) in self.sessions.items():
            if any(process[1] == pid for process in processes):
                return session_id
        return None


def _session_entry(session: Session) -> tuple[str | None, tuple[Process, ...]]:
    return session.context_id, tuple(sorted(map(process_key, session.processes)))


def view_of(answer: ActiveSessionsSnapshot) -> View:
    return View(
        answer.discovery,
        {s.session_id: _session_entry(s) for s in answer.sessions},
        tuple(sorted(map(process_key, answer.unowned))),
        tuple(answer.gaps),
    )


class _Follower:
    """A thread that keeps the latest view a path gave, and when it came."""

    what = "the path"

    def __init__(self, socket_path: Path) -> None:
        self._client = Client(socket_path)
        self._lock = threading.Condition()
        self.view: View | None = None
        self.at = 0.0  # monotonic, when :attr:`view` came
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def wait(self, wanted: Callable[[View], bool], deadline: float) -> tuple[View, float] | None:
        """The view once ``wanted`` holds and when it came, or None at ``deadline``."""
        with self._lock:
            while not (self.view is not None and wanted(self.view)):
                if self.error is not None:
                    raise AssertionError(f"{self.what} failed: {self.error!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
            return self.view, self.at

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._client.close()


class _Subscriber(_Follower):
    """A subscription's state, built from its notifications."""

    what = "the subscription"

    def __init__(self, socket_path: Path) -> None:
        super().__init__(socket_path)
        self._sessions: dict[str, tuple[str | None, tuple[Process, ...]]] = {}

    def start(self) -> None:
        self._subscription = self._client.subscribe()
        self._subscription.__enter__()  # subscribed before the test writes anything
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    change = self._subscription.next(timeout_s=0.1)
                except TimeoutError:
                    continue
                with self._lock:
                    if change.full:
                        self._sessions = {}
                    for session in [*change.added, *change.changed]:
                        self._sessions[session.session_id] = _session_entry(session)
                    for session_id in change.removed:
                        self._sessions.pop(session_id, None)
                    self.view = View(
                        change.discovery,
                        dict(self._sessions),
                        tuple(sorted(map(process_key, change.unowned))),
                        tuple(change.gaps),
                    )
                    self.at = time.monotonic()
                    self._lock.notify_all()
        except BaseException as exc:  # reported by the test's next expect
            self.error = exc
            with self._lock:
                self._lock.notify_all()

    def close(self) -> None:
        super().close()
        self._subscription.close()


class _LongPoll(_Follower):
    """A ``since`` long poll asked again after each answer; its latest answer kept."""

    what = "the long poll"

    def start(self) -> None:
        first = self._client.snapshot()
        self.view = view_of(first)
        self._since = first.generation
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                answer = self._client.snapshot(since=self._since, timeout_ms=200)
                with self._lock:
                    self._since = answer.generation
                    self.view = view_of(answer)
                    self.at = time.monotonic()
                    self._lock.notify_all()
        except BaseException as exc:
            self.error = exc
            with self._lock:
                self._lock.notify_all()


class Asking:
    """Plain snapshots (asked by :meth:`expect`), a long poll and a subscription, at once.

    Args:
        socket_path: the daemon's socket.
    """

    def __init__(self, socket_path: Path) -> None:
        self.client = Client(socket_path)
        self._subscriber = _Subscriber(socket_path)
        self._long_poll = _LongPoll(socket_path)
        #: Seconds each path took to show what :meth:`expect` waited for, per call.
        self.latencies: dict[str, list[float]] = {"plain": [], "long poll": [], "subscription": []}

    def start(self) -> None:
        self._subscriber.start()
        self._long_poll.start()

    def close(self) -> None:
        self._subscriber.close()
        self._long_poll.close()
        self.client.close()

    def plain(self, wanted: Callable[[View], bool], deadline: float) -> tuple[View, float] | None:
        """Plain ``sessions.snapshot`` (default ``max_age_ms``) every 2 ms until ``wanted``."""
        while True:
            view = view_of(self.client.snapshot())
            if wanted(view):
                return view, time.monotonic()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.002)

    def expect(
        self,
        wanted: Callable[[View], bool],
        *,
        within_s: float = SHOWN_WITHIN_S,
        what: str = "the change",
    ) -> View:
        """Wait until all three paths show ``wanted``, each within ``within_s`` from now.

        Raises:
            AssertionError: naming each path that did not, with its last view.
        """
        since = time.monotonic()
        deadline = since + within_s
        late: list[str] = []
        view: View | None = None
        waits: list[tuple[str, Callable[[], tuple[View, float] | None]]] = [
            ("plain", lambda: self.plain(wanted, deadline)),
            ("long poll", lambda: self._long_poll.wait(wanted, deadline)),
            ("subscription", lambda: self._subscriber.wait(wanted, deadline)),
        ]
        for name, wait in waits:
            seen = wait()
            if seen is None:
                last = {"long poll": self._long_poll.view, "subscription": self._subscriber.view}
                late.append(f"{name} (last seen: {last.get(name, '-')})")
            else:
                view, at = seen
                self.latencies[name].append(max(at - since, 0.0))
        assert not late, f"{what}: not shown within {within_s} s by " + "; ".join(late)
        assert view is not None
        return view


@contextmanager
def asking(socket_path: Path) -> Iterator[Asking]:
    """A started :class:`Asking`, closed afterwards."""
    paths = Asking(socket_path)
    paths.start()
    try:
        yield paths
    finally:
        paths.close()
