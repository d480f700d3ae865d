"""The native watch where inotify is not the daemon's own: watchfiles (FSEvents on macOS).

watchfiles' ``RustNotify`` (the engine under ``watchfiles.awatch``) is
driven directly, in a worker thread, so that ``started()`` means the watch
exists and cancellation takes one ``step_ms``. On Linux the daemon uses its
own inotify watch instead (``capsuled.watch.inotify``; docs/design.md §8
says why: notify follows symlinks, re-points watches and drops the kernel's
overflow event). Paths reported through a symlink are dropped here, and the
reader never follows one, so a link cannot make a wrong answer; what this
backend may still lose silently is found by verification.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path, PurePath
from typing import Final

import anyio
import anyio.lowlevel
import structlog
from watchfiles import Change
from watchfiles._rust_notify import RustNotify, WatchfilesRustInternalError

from capsuled.home.layout import STORE_FILES, Parts, reader_cares

from .changes import ChangeFeed
from .cookies import Cookies
from .inotify import WatchLost

__all__ = ["WatchfilesWatch"]

log = structlog.get_logger("capsuled.watcher")

#: Why a watch could not start or failed: the watch limit (``OSError``), no
#: native backend (``WatchfilesRustInternalError``).
_WatchError: Final = (OSError, WatchfilesRustInternalError)


class WatchfilesWatch:
    """A recursive watchfiles watch of the home.

    Args:
        home: the home, absolute.
        feed: where changed paths and store writes go.
        step_ms: a batch is handed over once it stopped growing for this long.
        debounce_ms: a batch that keeps growing is handed over after this long.
    """

    backend: Final = "watchfiles"
    overflows: Final = 0  # not reported by this backend
    polled: Final = 0

    def __init__(
        self, home: str, feed: ChangeFeed, *, step_ms: int = 10, debounce_ms: int = 50
    ) -> None:
        self._home = home
        self._feed = feed
        self._step_ms = step_ms
        self._debounce_ms = debounce_ms
        self._limiter = anyio.CapacityLimiter(1)
        self._cookies = Cookies(home, feed)
        self._running = False

    @property
    def watched(self) -> int:
        """Directories watched: not known for this backend (0)."""
        return 0

    async def run(self, started: Callable[[], None]) -> None:
        """Watch until cancelled.

        Raises:
            OSError: the watch cannot start (the caller falls back to polling).
            WatchLost: the watch failed or the home was deleted.
        """
        stop = threading.Event()
        try:
            notify = await anyio.to_thread.run_sync(
                RustNotify, [self._home], False, False, 0, True, False, abandon_on_cancel=True
            )
        except WatchfilesRustInternalError as exc:
            raise OSError(str(exc)) from exc
        try:
            self._running = True
            started()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_set_when_cancelled, stop)
                await self._pump(notify, stop)
        finally:
            stop.set()
            self._running = False
            self._cookies.release()
            notify.close()

    async def sync(self) -> None:
        """Wait until a cookie created now is reported (every earlier change is fed)."""
        if self._running:
            await self._cookies.barrier()

    async def _pump(self, notify: RustNotify, stop: threading.Event) -> None:
        while True:
            try:
                await anyio.lowlevel.checkpoint_if_cancelled()
                raw = await anyio.to_thread.run_sync(
                    _next, notify, stop, self._debounce_ms, self._step_ms, limiter=self._limiter
                )
            except _WatchError as exc:
                raise WatchLost(f"watch failed: {exc}") from exc
            if raw is None:
                await anyio.sleep_forever()
            else:
                self._sort(raw)

    def _sort(self, raw: Iterable[tuple[int, str]]) -> None:
        paths: set[Path] = set()
        store = False
        cookies: list[str] = []
        for kind, reported in raw:
            try:
                parts: Parts = PurePath(reported).relative_to(self._home).parts
            except ValueError:
                continue
            if not parts:
                if kind == Change.deleted:
                    raise WatchLost("the home was deleted")
                continue
            if len(parts) == 1 and self._cookies.ours(parts[0]):
                cookies.append(parts[0])
            elif parts in STORE_FILES:
                store = True
            elif reader_cares(parts) and not _through_link(self._home, parts):
                paths.add(Path(self._home, *parts))
        if paths:
            self._feed.add(paths)
        if store:
            self._feed.store_changed()
        for name in cookies:
            self._cookies.arrived(name)


async def _set_when_cancelled(stop: threading.Event) -> None:
    """Set ``stop`` once the scope is cancelled: the thread's ``watch`` then returns."""
    try:
        await anyio.sleep_forever()
    finally:
        stop.set()


def _next(
    notify: RustNotify, stop: threading.Event, debounce_ms: int, step_ms: int
) -> set[tuple[int, str]] | None:
    """One batch (in a worker thread); None once ``stop`` is set."""
    while True:
        raw = notify.watch(debounce_ms, step_ms, 5000, stop)
        if raw == "stop":
            return None
        if isinstance(raw, set):
            return raw


def _through_link(home: str, parts: Parts) -> bool:
    """Whether a directory between the home and ``parts`` is not the real path to it."""
    parent = os.path.join(home, *parts[:-1])
    return os.path.realpath(parent) != os.path.join(os.path.realpath(home), *parts[:-1])
