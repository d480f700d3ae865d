"""The watcher feed: changes under the home into the reader's ``pending`` (SPEC §5, §8).

One long-running service, :meth:`HomeWatcher.serve`, keeps a recursive watch on
the home and adds every changed path the reader cares about to the
:class:`~capsuled.changes.ChangeFeed`. Whenever events may have been missed —
the watch (re)starts, the home is deleted or replaced, the watch fails — it
asks the feed for a rescan instead. Design notes and measured latency:
``docs/watcher.md``.

The watch is watchfiles' ``RustNotify`` (the engine under ``watchfiles.awatch``)
driven directly rather than through ``awatch``, for four reasons, each a fact
measured on this kind of machine (LIBRARY-FACTS.md, watchfiles):

- ``awatch`` builds the watch inside its first iteration, so a caller cannot
  tell when it exists; here ``task_status.started()`` is called once it does,
  and "ready" means "changes from now on reach the feed".
- The recursive watch setup runs on the event loop in ``awatch`` (2.4 s for
  30,000 directories, cold); here it runs in a worker thread.
- A native watch that cannot start (watch limit, no inotify instance left)
  raises where the polling fallback is decided, not inside an iterator.
- Cancellation sets the ``stop_event`` as it starts, so shutdown takes one
  ``step_ms`` instead of the 5 s ``rust_timeout``.
"""

from __future__ import annotations

import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Final, get_args

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import TaskStatus
from watchfiles import Change
from watchfiles._rust_notify import RustNotify, WatchfilesRustInternalError

from capsule_client.protocol import WatcherMode
from capsuled.changes import ChangeFeed

__all__ = ["WATCH_MODES", "HomeWatcher", "reader_cares"]

log = structlog.get_logger("capsuled.watcher")

#: The values ``--watch`` / ``CAPSULED_WATCH`` accept.
WATCH_MODES: Final[tuple[WatcherMode, ...]] = get_args(WatcherMode)

_PROVIDER_CLIENTS: Final = "provider-clients"
_EXEC_PROCESSES: Final = "exec-processes"
_SERVERS_REGISTRY: Final = "opencode-servers.json"
#: The ownership store and its write-ahead log: a commit writes one of them;
#: it is fed as "the store changed", never as a path (``ChangeFeed.store_changed``).
_STORE_FILES: Final = (("capsule.db",), ("capsule.db-wal",))

#: How long to wait before restarting a watch that failed, doubled per
#: consecutive failure up to the maximum.
_RESTART_DELAY_S: Final = 0.1
_RESTART_DELAY_MAX_S: Final = 5.0
#: A native watch that fails this many times in a row without one good batch
#: is given up for polling (a name it cannot decode, read again by every walk).
NATIVE_FAILURES_BEFORE_POLLING: Final = 3

#: Why a native watch could not start: the watch limit (``OSError``), no inotify
#: instance left or no native backend (``WatchfilesRustInternalError``).
_NativeStartError = (OSError, WatchfilesRustInternalError)


def reader_cares(relative: PurePath) -> bool:
    """Whether a change at ``relative`` (to the home) can matter to the reader.

    The reader (SPEC §5, seed 004 ``reconcile``) reads receipts in two places
    and the servers registry; a change to a directory on the way to them makes
    it walk that directory or rescan. Everything else — the store and its
    ``-wal``/``-shm``/``-journal`` files, ``sessions/*/trace.jsonl``, the
    socket, ``manifest.json``, anything below a provider-clients directory or
    an exec receipt — is noise that would cost the reader a walk or a rescan
    and can never change an answer. Names starting with ``.`` are invisible
    anywhere in the path (SPEC §2).

    Args:
        relative: the changed path relative to the home; the home itself is
            ``PurePath()`` and is not a change the reader is fed (the watcher
            handles it).

    Returns:
        ``True`` for ``runs``, ``runs/<run>``, ``runs/<run>/<input>``,
        ``runs/<run>/<input>/provider-clients``, ``…/provider-clients/*.json``,
        ``runtime``, ``runtime/exec-processes``, ``runtime/exec-processes/*.json``
        and ``runtime/opencode-servers.json``; ``False`` otherwise.
    """
    parts = relative.parts
    if not parts or any(part.startswith(".") for part in parts):
        return False
    depth = len(parts)
    if parts[0] == "runs":
        if depth <= 3:
            return True
        if parts[3] != _PROVIDER_CLIENTS:
            return False
        return depth == 4 or (depth == 5 and parts[4].endswith(".json"))
    if parts[0] == "runtime":
        if depth == 1:
            return True
        if parts[1] == _SERVERS_REGISTRY:
            return depth == 2
        if parts[1] != _EXEC_PROCESSES:
            return False
        return depth == 2 or (depth == 3 and parts[2].endswith(".json"))
    return False


def _is_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the directory at ``path``, ``None`` if there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


class _Restart(Exception):
    """The current watch can no longer be trusted (or never started); start a new one."""


@dataclass(slots=True)
class _Batch:
    """One batch of changes, sorted: what to feed, whether the store was written,
    and whether the watch is lost."""

    paths: set[Path] = field(default_factory=set)
    store: bool = False
    lost: bool = False


class _FellBack(Exception):
    """A native watch could not start; the watcher now polls."""


class HomeWatcher:
    """Feeds changes under one home into a :class:`ChangeFeed` (SPEC §8 "the watcher").

    Attributes:
        home: the home, absolute but not resolved: changed paths are fed as
            ``home / relative`` so they compare equal to the reader's paths.
        mode: what the watcher does now: ``native`` (inotify, FSEvents, ...),
            ``polling`` (chosen, or fallen back to because a native watch could
            not start), or ``off`` (no watch; a rescan is owed every
            ``off_rescan_interval_s`` instead). Reported in ``status.watcher``.
        starts: how many times a watch was started (1 after a clean start;
            each restart adds one).
    """

    def __init__(
        self,
        home: Path,
        feed: ChangeFeed,
        *,
        mode: WatcherMode = "native",
        step_ms: int = 10,
        debounce_ms: int = 50,
        poll_delay_ms: int = 200,
        home_check_interval_s: float = 1.0,
        home_wait_interval_s: float = 0.05,
        off_rescan_interval_s: float = 1.0,
        rescan_interval_s: float | None = None,
    ) -> None:
        """Prepare a watcher; nothing is watched before :meth:`serve`.

        Args:
            home: the home directory (SPEC §2); it need not exist yet.
            feed: where changed paths and rescan requests go.
            mode: ``native`` (fall back to ``polling`` if a native watch cannot
                start), ``polling`` or ``off``.
            step_ms: a batch of changes is handed over once it stopped growing
                for this long (watchfiles ``step``); also the time shutdown
                takes.
            debounce_ms: a batch that keeps growing is handed over after at
                most this long.
            poll_delay_ms: the interval between two walks in polling mode.
            home_check_interval_s: how often the home's (device, inode) is
                compared with the watched one, to catch a replaced home the
                watch did not report.
            home_wait_interval_s: how often a missing home is looked for.
            off_rescan_interval_s: in mode ``off``, how often a rescan is owed
                (the daemon passes its sample interval).
            rescan_interval_s: in the other modes, how often a rescan is owed
                anyway: the net under what a watch loses silently (kernel
                queue overflows, directories past the watch limit; SPEC §8
                ``--rescan-interval``). ``None``: never.

        Raises:
            ValueError: ``mode`` is not one of :data:`WATCH_MODES`.
        """
        if mode not in WATCH_MODES:
            raise ValueError(f"watch mode must be one of {', '.join(WATCH_MODES)}, not {mode!r}")
        self.home = home.absolute()
        self.mode: WatcherMode = mode
        self.starts = 0
        self._feed = feed
        self._step_ms = step_ms
        self._debounce_ms = debounce_ms
        self._poll_delay_ms = poll_delay_ms
        self._home_check_interval_s = home_check_interval_s
        self._home_wait_interval_s = home_wait_interval_s
        self._off_rescan_interval_s = off_rescan_interval_s
        self._rescan_interval_s = rescan_interval_s
        # The blocking ``watch`` call holds a worker thread for the watcher's
        # life; its own limiter keeps it off the default pool's 40 tokens.
        self._limiter = anyio.CapacityLimiter(1)
        self._failures = 0
        self._next_home_check = 0.0

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch the home until cancelled.

        ``task_status.started()`` is called once the first watch exists (a
        change made after ``tg.start`` returns reaches the feed), or at once
        when the home does not exist yet or the mode is ``off``. Cancellation
        returns within about ``step_ms``. Errors never escape: a failed watch
        is logged, a rescan is owed, and the watch is restarted.
        """
        if self.mode == "off":
            log.info("watcher off; owing a rescan periodically", home=str(self.home))
            self._feed.request_rescan()
            task_status.started()
            await self._owe_rescans(self._off_rescan_interval_s)
            return
        stop = threading.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_set_when_cancelled, stop)
            if self._rescan_interval_s is not None:
                tg.start_soon(self._owe_rescans, self._rescan_interval_s)
            await self._run(stop, task_status)

    async def _owe_rescans(self, interval_s: float) -> None:
        while True:
            await anyio.sleep(interval_s)
            self._feed.request_rescan()

    async def _run(self, stop: threading.Event, task_status: TaskStatus[None]) -> None:
        started = False
        while True:
            identity = await anyio.to_thread.run_sync(_identity, self.home)
            if identity is None:
                await self._wait_for_home(task_status if not started else None)
                started = True
                continue
            try:
                notify = await self._start()
            except _FellBack:
                continue
            except _Restart:
                if not started:
                    task_status.started()
                    started = True
                continue
            try:
                self.starts += 1
                # Anything that happened before the watch existed is unseen.
                self._feed.request_rescan()
                log.info("watching home", home=str(self.home), mode=self.mode, starts=self.starts)
                if not started:
                    task_status.started()
                    started = True
                await self._pump(notify, stop, identity)
            except _Restart:
                self._feed.request_rescan()
            finally:
                notify.close()

    async def _wait_for_home(self, task_status: TaskStatus[None] | None) -> None:
        log.warning("home missing; waiting for it", home=str(self.home))
        self._feed.request_rescan()
        if task_status is not None:
            task_status.started()
        # Polling: a watch on the parent would need the parent to exist and
        # to be watchable, and a missing home is rare and short.
        while await anyio.to_thread.run_sync(_identity, self.home) is None:  # noqa: ASYNC110
            await anyio.sleep(self._home_wait_interval_s)
        log.info("home is back", home=str(self.home))

    async def _start(self) -> RustNotify:
        """Start a watch in the current mode.

        Raises:
            _FellBack: a native watch could not start; the mode is now ``polling``.
            _Restart: the watch could not start; try again (after a back-off).
        """
        force_polling = self.mode == "polling"
        try:
            return await anyio.to_thread.run_sync(
                RustNotify,
                [str(self.home)],
                False,  # debug
                force_polling,
                self._poll_delay_ms,
                True,  # recursive
                False,  # ignore_permission_denied: it would hide the watch limit too
                abandon_on_cancel=True,
            )
        except FileNotFoundError as exc:
            # The home (or a directory below it) went away during the setup.
            await anyio.sleep(self._home_wait_interval_s)
            raise _Restart from exc
        except _NativeStartError as exc:
            if force_polling:
                await self._back_off("polling watch cannot start", exc)
                raise _Restart from exc
            self.mode = "polling"
            log.warning(
                "native watch cannot start; falling back to polling",
                home=str(self.home),
                cause=str(exc),
                poll_delay_ms=self._poll_delay_ms,
            )
            raise _FellBack from exc

    async def _pump(
        self, notify: RustNotify, stop: threading.Event, identity: tuple[int, int]
    ) -> None:
        """Move batches from ``notify`` into the feed; raise :class:`_Restart` when lost.

        The wait and the sorting (``lstat`` calls included) run in the watch's
        worker thread; the feed is fed here, on the event loop, as
        ``capsuled.changes`` expects.
        """
        self._next_home_check = time.monotonic() + self._home_check_interval_s
        while True:
            # ``run_sync`` shields its wait and does not raise a cancellation
            # that arrived meanwhile: without this, a stop event that was not
            # set would leave this loop running after its scope is cancelled.
            await anyio.lowlevel.checkpoint_if_cancelled()
            try:
                batch = await anyio.to_thread.run_sync(
                    self._next_batch, notify, stop, identity, limiter=self._limiter
                )
            except (OSError, WatchfilesRustInternalError) as exc:
                await self._back_off("watch failed", exc)
                if self.mode == "native" and self._failures >= NATIVE_FAILURES_BEFORE_POLLING:
                    self._give_up_native(exc)
                raise _Restart from exc
            if batch is None:
                # Only cancellation sets ``stop``: let it through.
                await anyio.sleep_forever()
                return
            if batch.paths:
                self._feed.add(batch.paths)
            if batch.store:
                self._feed.store_changed()
            if batch.lost:
                raise _Restart

    def _next_batch(
        self, notify: RustNotify, stop: threading.Event, identity: tuple[int, int]
    ) -> _Batch | None:
        """Wait for one batch and sort it (in a worker thread).

        Returns:
            the paths to feed and whether the home was lost (deleted, or its
            identity changed); ``None`` when ``stop`` was set.

        Raises:
            OSError, WatchfilesRustInternalError: the watch failed.
        """
        raw = notify.watch(
            self._debounce_ms,
            self._step_ms,
            max(1, int(self._home_check_interval_s * 1000)),  # timeout_ms
            stop,
        )
        if raw == "stop":
            return None
        batch = _Batch()
        if isinstance(raw, set):
            self._failures = 0
            batch = self._sort(raw)
        now = time.monotonic()
        if not batch.lost and now >= self._next_home_check:
            self._next_home_check = now + self._home_check_interval_s
            if _identity(self.home) != identity:
                log.warning("home replaced or removed; restarting", home=str(self.home))
                batch.lost = True
        return batch

    def _sort(self, raw: Iterable[tuple[int, str]]) -> _Batch:
        """The paths of a raw batch the reader cares about, and whether the home was deleted."""
        batch = _Batch()
        for kind, reported in raw:
            try:
                relative = PurePath(reported).relative_to(self.home)
            except ValueError:
                log.debug("change outside the home ignored", path=reported)
                continue
            if not relative.parts:
                batch.lost |= kind == Change.deleted
                continue
            if relative.parts in _STORE_FILES:
                batch.store = True
                continue
            if not reader_cares(relative):
                continue
            path = self.home / relative
            # A directory's own "modified" (its mtime when an entry came or
            # went, a chmod) says nothing the entries' own events do not; fed,
            # it would make the reader walk or rescan for nothing.
            if kind == Change.modified and _is_directory(path):
                continue
            batch.paths.add(path)
        if batch.lost:
            log.warning("home deleted; restarting the watch", home=str(self.home))
        return batch

    def _give_up_native(self, exc: BaseException) -> None:
        """Poll from now on: the native watch keeps failing at run time.

        One known cause: a name under the home that is not UTF-8 in a place
        the reader reads (a run directory, a receipt). Each walk opens it, an
        open is an inotify event, and watchfiles fails to decode the event's
        path, so every restarted watch fails at the walk that follows it, and
        changes would be seen only at those restarts. The poller fails on
        such a name only when something below it changes.
        """
        self.mode = "polling"
        self._failures = 0
        log.warning(
            "native watch keeps failing; falling back to polling",
            home=str(self.home),
            failures=NATIVE_FAILURES_BEFORE_POLLING,
            cause=str(exc),
            poll_delay_ms=self._poll_delay_ms,
        )

    async def _back_off(self, what: str, exc: BaseException) -> None:
        delay_s = min(_RESTART_DELAY_MAX_S, _RESTART_DELAY_S * 2**self._failures)
        self._failures += 1
        log.warning(
            f"{what}; trying again",
            home=str(self.home),
            mode=self.mode,
            cause=str(exc),
            delay_s=delay_s,
        )
        self._feed.request_rescan()
        await anyio.sleep(delay_s)


async def _set_when_cancelled(stop: threading.Event) -> None:
    """Set ``stop`` as soon as the enclosing scope is cancelled.

    A ``watch`` call in a worker thread cannot be cancelled; it returns
    ``"stop"`` within one ``step_ms`` of the event being set.
    """
    try:
        await anyio.sleep_forever()
    finally:
        stop.set()
