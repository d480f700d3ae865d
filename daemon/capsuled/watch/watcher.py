"""The watcher service: changes under the home into the reader's feed (docs/design.md §8).

:class:`HomeWatcher` runs one watch at a time and keeps it running: the
daemon's own inotify watch on Linux (``capsuled.watch.inotify``), watchfiles
elsewhere (``capsuled.watch.watchfiles_native``), or the daemon's own ``lstat``
poller (``capsuled.watch.polling``). A native watch that cannot start falls back
to polling, with a warning naming the cause. Whenever events may have been
lost (a restart, the home removed or replaced), it owes the reader a walk.
:meth:`HomeWatcher.sync` is the read-your-writes barrier: a cookie through a
native watch, a poll pass while polling.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal, Protocol, get_args

import anyio
import structlog
from anyio.abc import TaskStatus

from capsule_client.wire import WatcherMode, WatchStatus
from capsuled.common.shortage import descriptors_short, is_shortage, shortage_gap
from capsuled.home.layout import reader_cares

from .changes import ChangeFeed, ChangesFound
from .inotify import InotifyWatch, WatchLost
from .polling import HomeMissing, Poller

__all__ = ["DEFAULT_POLL_INTERVAL_S", "WATCH_MODES", "Backend", "HomeWatcher", "reader_cares"]

log = structlog.get_logger("capsuled.watcher")

#: The values ``--watch`` / ``CAPSULED_WATCH`` accept.
WATCH_MODES: Final[tuple[WatcherMode, ...]] = get_args(WatcherMode)
#: Seconds between two poll passes, unless configured otherwise (``--poll-interval``).
DEFAULT_POLL_INTERVAL_S: Final = 0.5

#: Which native watch to use: ``auto`` is inotify on Linux, watchfiles elsewhere.
Backend = Literal["auto", "inotify", "watchfiles"]

#: How long to wait before restarting a watch that failed, doubled per
#: consecutive failure up to the maximum.
_RESTART_DELAY_S: Final = 0.1
_RESTART_DELAY_MAX_S: Final = 5.0
#: How often a home configured through a symlink is checked for being re-pointed, seconds.
_LINKED_HOME_CHECK_S: Final = 1.0


class _Watch(Protocol):
    @property
    def backend(self) -> str: ...

    @property
    def watched(self) -> int: ...

    @property
    def polled(self) -> int: ...

    @property
    def overflows(self) -> int: ...

    async def sync(self) -> None: ...


class _Runnable(_Watch, Protocol):
    async def run(self, started: Callable[[], None]) -> None: ...


class _PollingWatch:
    """``--watch polling``: the daemon's own ``lstat`` walk every ``poll_interval_s``."""

    backend: Final = "lstat"
    overflows: Final = 0

    def __init__(self, home: str, feed: ChangeFeed, *, poll_interval_s: float) -> None:
        self._home = home
        self._feed = feed
        self._poller = Poller(home)
        self._poll_interval_s = poll_interval_s
        self._lock = anyio.Lock()
        self._running = False

    @property
    def watched(self) -> int:
        return 0

    @property
    def polled(self) -> int:
        return self._poller.directories

    async def run(self, started: Callable[[], None]) -> None:
        """Poll until cancelled.

        Raises:
            WatchLost: the home went away or was replaced.
        """
        await self._pass()
        self._running = True
        try:
            started()
            while True:
                await anyio.sleep(self._poll_interval_s)
                await self._pass()
        finally:
            self._running = False

    async def sync(self) -> None:
        """Poll now: what changed before this call is fed when it returns."""
        if not self._running:
            return
        try:
            await self._pass()
        except WatchLost:
            self._feed.request_rescan()  # the run loop restarts the watch

    async def _pass(self) -> None:
        async with self._lock:
            try:
                found: ChangesFound = await anyio.to_thread.run_sync(self._poller.walk)
            except HomeMissing as exc:
                raise WatchLost(str(exc)) from exc
        found.feed(self._feed, self._home)


class HomeWatcher:
    """Feeds changes under one home into a :class:`ChangeFeed`.

    Args:
        home: the home directory; it need not exist yet. Paths are fed as
            ``home / relative``, the home made absolute but not resolved.
        feed: where changed paths, store writes and rescan requests go.
        mode: ``native`` (falls back to ``polling`` if it cannot start),
            ``polling`` or ``off`` (nothing watched).
        backend: the native watch: ``auto``, ``inotify`` or ``watchfiles``.
        poll_interval_s: seconds between two poll passes (polling mode, and
            directories a native watch could not watch).
        home_wait_interval_s: how often a missing home is looked for, seconds.
        rescan_at_start: owe a walk when the first watch starts (False when
            the reader's first observation, a walk, begins after it).

    Attributes:
        mode: what runs now (``status.watch.mode``).
        starts: how many watches were started (each restart adds one).

    Raises:
        ValueError: ``mode`` is not one of :data:`WATCH_MODES`.
    """

    def __init__(
        self,
        home: Path,
        feed: ChangeFeed,
        *,
        mode: WatcherMode = "native",
        backend: Backend = "auto",
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        home_wait_interval_s: float = 0.05,
        rescan_at_start: bool = True,
    ) -> None:
        if mode not in WATCH_MODES:
            raise ValueError(f"watch must be one of {', '.join(WATCH_MODES)}, not {mode!r}")
        self.home = home.absolute()
        # A home reached through a symlink: re-pointing it makes no event.
        self._linked = os.path.realpath(self.home) != str(self.home)
        self.mode: WatcherMode = mode
        self.starts = 0
        self._feed = feed
        self._backend: Backend = backend
        self._poll_interval_s = poll_interval_s
        self._home_wait_interval_s = home_wait_interval_s
        self._rescan_at_start = rescan_at_start
        self._watch: _Watch | None = None
        self._watching = False  # the current watch has started and runs
        self._overflows = 0  # of watches before the current one
        self._failures = 0

    @property
    def status(self) -> WatchStatus:
        """What ``status.watch`` shows."""
        watch = self._watch
        return WatchStatus(
            mode=self.mode,
            backend="none" if watch is None else watch.backend,
            watched_directories=0 if watch is None else watch.watched,
            polled_directories=0 if watch is None else watch.polled,
            overflows=self._overflows + (0 if watch is None else watch.overflows),
            starts=self.starts,
        )

    def recheck(self) -> None:
        """Verification found changes the watch missed: make the watch whole again.

        The native watch adds every watch again (a directory replaced unseen,
        say by a mount over it, gets its own); polling needs nothing.
        """
        watch = self._watch
        if self._watching and isinstance(watch, InotifyWatch):
            log.info("re-adding every watch after changes it missed", home=str(self.home))
            watch.recheck()

    @property
    def notes(self) -> list[str]:
        """Plain-language remarks for ``status``."""
        watch = self._watch
        if watch is None or self.mode != "native" or not watch.polled:
            return []
        return [
            f"{watch.polled} directories could not be watched (the inotify watch limit, "
            "fs.inotify.max_user_watches?); they are polled every "
            f"{self._poll_interval_s:g} s and retried"
        ]

    async def sync(self) -> None:
        """Return once every change made before the call has been fed (read-your-writes).

        A cookie through a native watch, a poll pass while polling. While no
        watch runs (the home is missing, a watch is restarting) nothing would
        report what was written meanwhile: the next observation is made to walk
        instead. At once in mode ``off``, where every observation walks.
        """
        watch = self._watch
        if self.mode == "off":
            return
        if watch is None or not self._watching:
            self._feed.request_rescan()
            return
        await watch.sync()

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch the home until cancelled.

        ``task_status.started()`` is called once the first watch exists (a
        change made after ``tg.start`` returns reaches the feed), or at once
        when the home does not exist yet or the mode is ``off``. Errors never
        escape: a lost watch is logged, a walk is owed, and it is restarted.
        """
        if self.mode == "off":
            log.info("watcher off: every observation walks the home", home=str(self.home))
            task_status.started()
            await anyio.sleep_forever()
        reported = False

        def started() -> None:
            nonlocal reported
            self._watching = True
            self.starts += 1
            self._failures = 0
            if self.starts > 1 or self._rescan_at_start:
                self._feed.request_rescan()  # what happened before the watch existed
            log.info(
                "watching home",
                home=str(self.home),
                mode=self.mode,
                backend=self._watch.backend if self._watch else None,
                starts=self.starts,
            )
            if not reported:
                reported = True
                task_status.started()

        while True:
            if not _is_directory(self.home):
                if not reported:
                    reported = True
                    task_status.started()
                await self._wait_for_home()
            watch = self._new_watch()
            self._watch = watch
            try:
                await self._run(watch, started)
            except WatchLost as exc:
                log.warning(
                    "watch lost; walking and watching again", home=str(self.home), cause=str(exc)
                )
                self._feed.request_rescan()
                await self._back_off()
            except OSError as exc:
                self._cannot_start(exc)
            finally:
                self._watching = False
                self._overflows += watch.overflows
                self._watch = None

    async def _run(self, watch: _Runnable, started: Callable[[], None]) -> None:
        """Run ``watch``; for a home configured through a symlink, check where it points.

        Re-pointing a symlink makes no event in the directory it pointed to,
        so such a home's identity is compared every
        :data:`_LINKED_HOME_CHECK_S` (the only case with a timer of its own).

        Raises:
            WatchLost: the watch lost the home, or the link points elsewhere now.
        """
        if not self._linked:
            await watch.run(started)
            return
        identity = _identity(self.home)
        repointed = False
        async with anyio.create_task_group() as tg:

            async def check() -> None:
                nonlocal repointed
                # No event says a link was re-pointed: this is a poll, on purpose.
                while _identity(self.home) == identity:  # noqa: ASYNC110
                    await anyio.sleep(_LINKED_HOME_CHECK_S)
                repointed = True
                tg.cancel_scope.cancel()

            tg.start_soon(check)
            await watch.run(started)
        if repointed:
            raise WatchLost("the home's symlink points to another directory now")

    def _new_watch(self) -> _Runnable:
        home = str(self.home)
        if self.mode == "polling":
            return _PollingWatch(home, self._feed, poll_interval_s=self._poll_interval_s)
        backend = self._backend
        if backend == "watchfiles" or (backend == "auto" and not sys.platform.startswith("linux")):
            from .watchfiles_native import WatchfilesWatch

            return WatchfilesWatch(home, self._feed)
        return InotifyWatch(home, self._feed, poll_interval_s=self._poll_interval_s)

    def _cannot_start(self, exc: OSError) -> None:
        """A native watch that cannot start: poll from now on (a polling one: try again)."""
        if self.mode == "polling":
            log.warning("polling cannot start; trying again", home=str(self.home), cause=str(exc))
            return
        self.mode = "polling"
        log.warning(
            "native watch cannot start; falling back to polling",
            home=str(self.home),
            # tempfile says ENOENT when every open failed for EMFILE: probe.
            cause=shortage_gap(exc.errno, retrying=False)
            if is_shortage(exc) or descriptors_short()
            else str(exc),
            poll_interval_s=self._poll_interval_s,
        )
        self._feed.request_rescan()

    async def _wait_for_home(self) -> None:
        log.warning("home missing; waiting for it", home=str(self.home))
        self._feed.request_rescan()
        # Polling: a watch on the parent would need the parent to exist and
        # be watchable, and a missing home is rare and short.
        while not _is_directory(self.home):  # noqa: ASYNC110
            await anyio.sleep(self._home_wait_interval_s)
        log.info("home is back", home=str(self.home))

    async def _back_off(self) -> None:
        delay_s = min(_RESTART_DELAY_MAX_S, _RESTART_DELAY_S * 2**self._failures)
        self._failures += 1
        if self._failures > 1:
            await anyio.sleep(delay_s)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the directory ``path`` leads to; None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _is_directory(path: Path) -> bool:
    """Whether the home is a directory (a home configured as a symlink is followed)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False
