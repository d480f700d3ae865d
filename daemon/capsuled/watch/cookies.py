"""Cookies: the read-your-writes barrier through a native watch (docs/design.md §5).

A cookie is a hidden file the daemon creates in the home. Events are queued
in order, so once the watch reports the cookie, every change made before it
was created has been reported too (watchman's sync). The backend that sees a
cookie's event calls :meth:`Cookies.arrived`; the reader never sees them
(hidden names are invisible).
"""

from __future__ import annotations

import itertools
import os
from typing import Final

import anyio
import structlog

from .changes import ChangeFeed

__all__ = ["COOKIE_PREFIX", "Cookies"]

log = structlog.get_logger("capsuled.watcher")

#: Cookie files: hidden, and named by the daemon's pid.
COOKIE_PREFIX: Final = ".capsuled-cookie-"


class Cookies:
    """The cookies one watch waits for.

    Args:
        home: the home, absolute.
        feed: owed a walk when a cookie cannot be created (a read-only home, a
            full disk): the walk is then the barrier.
    """

    def __init__(self, home: str, feed: ChangeFeed) -> None:
        self._home = home
        self._feed = feed
        self._waiting: dict[str, anyio.Event] = {}
        self._numbers = itertools.count(1)
        self._failed = False

    def ours(self, name: str) -> bool:
        """Whether ``name`` (an entry of the home) is a cookie being waited for."""
        return name in self._waiting

    def arrived(self, name: str) -> None:
        """The watch reported the cookie ``name``: its waiter may go on."""
        arrived = self._waiting.get(name)
        if arrived is not None:
            arrived.set()

    def release(self) -> None:
        """Let every waiter go on: the watch ended or lost events (a walk is owed)."""
        for arrived in self._waiting.values():
            arrived.set()

    async def barrier(self) -> None:
        """Create a cookie and wait until the watch reports it; then remove it."""
        name = f"{COOKIE_PREFIX}{os.getpid()}-{next(self._numbers)}"
        path = os.path.join(self._home, name)
        arrived = self._waiting[name] = anyio.Event()
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            del self._waiting[name]
            # Warned about once; a walk each time.
            level = log.debug if self._failed else log.warning
            level("cannot create a cookie in the home; walking instead", cause=str(exc))
            self._failed = True
            self._feed.request_rescan()
            return
        try:
            await arrived.wait()
        finally:
            del self._waiting[name]
            try:
                os.unlink(path)
            except OSError:
                pass
