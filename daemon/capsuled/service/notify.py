"""Telling systemd: sd_notify's ``READY=1``, ``STATUS=`` text, ``STOPPING=1`` and the watchdog.

sd_notify is a few lines over a datagram socket rather than a library: the
maintained wrappers either need libsystemd or swallow every error (docs/design.md §8).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import anyio
import structlog

from capsule_client.wire import ActiveSessionsSnapshot

__all__ = ["Notifier", "send_watchdog", "status_text", "tell_service_manager"]

_log = structlog.get_logger("capsuled.notify")

#: The longest a changed watch mode waits to reach ``STATUS=``, seconds.
_STATUS_RECHECK_S: Final = 60.0


class Notifier:
    """Sends sd_notify(3) messages to ``$NOTIFY_SOCKET``; does nothing without one.

    A datagram socket, a few lines (docs/design.md §8 records this exception to "use a
    library"). Send errors never stop the daemon: the first one of each kind is
    logged at warning, repeats at debug.

    Attributes:
        address: where messages go (``@name`` already turned into ``\\0name``),
            or None when disabled.
        watchdog_interval_s: half of ``$WATCHDOG_USEC`` in seconds when the
            watchdog is on for this process, else None.
    """

    def __init__(self, address: str | None, *, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_interval_s = watchdog_usec / 2_000_000 if watchdog_usec else None
        self._sock: socket.socket | None = None
        self._failed: set[int] = set()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """Read ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``.

        ``NOTIFY_SOCKET`` may be an absolute path or ``@name`` for the abstract
        namespace; anything else (e.g. ``vsock:``) disables notification with a
        warning. The watchdog is on when ``WATCHDOG_USEC`` is a positive integer
        and ``WATCHDOG_PID``, if set, is our pid (sd_watchdog_enabled(3)).
        """
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET") or None
        address: str | None = None
        if raw is not None:
            if raw.startswith("@"):
                address = "\0" + raw[1:]
            elif raw.startswith("/"):
                address = raw
            else:
                _log.warning("NOTIFY_SOCKET not supported; not notifying", notify_socket=raw)
        watchdog_usec: int | None = None
        usec, wd_pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID")
        if usec.isdigit() and int(usec) > 0 and (wd_pid is None or wd_pid == str(os.getpid())):
            watchdog_usec = int(usec)
        return cls(address, watchdog_usec=watchdog_usec)

    @property
    def enabled(self) -> bool:
        """Whether there is somewhere to send to."""
        return self.address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``VAR=value`` assignments as one datagram.

        Returns:
            True if the datagram was sent; False when disabled or the send failed.
        """
        if self.address is None or not assignments:
            return False
        message = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)  # never stall the event loop
            self._sock.sendto(message, self.address)
        except OSError as exc:
            code = exc.errno or 0
            level = _log.debug if code in self._failed else _log.warning
            self._failed.add(code)
            level("sd_notify failed", error=str(exc), message=message.decode())
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1`` (with a ``STATUS=`` line if given): start-up is complete."""
        return self.notify("READY=1", *([_status_line(status)] if status else []))

    def status(self, status: str) -> bool:
        """``STATUS=…``: one line shown by ``systemctl status``."""
        return self.notify(_status_line(status))

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: the event loop is alive."""
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: shutdown has begun."""
        return self.notify("STOPPING=1", *([_status_line(status)] if status else []))

    def close(self) -> None:
        """Close the datagram socket. Idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status_line(status: str) -> str:
    return "STATUS=" + " ".join(status.split())


def status_text(snapshot: ActiveSessionsSnapshot | None, watcher_mode: str) -> str:
    """The one ``STATUS=`` line ``systemctl status`` shows for the daemon.

    Args:
        snapshot: the latest observation's answer, None before the first.
        watcher_mode: ``native``, ``polling`` or ``off``.

    Returns:
        e.g. ``"ready: 2 active sessions, 1 unowned process; watcher native"``,
        or ``"unavailable: <the first gap>"``.
    """
    if snapshot is None:
        return f"starting: first observation of the home; watcher {watcher_mode}"
    if snapshot.discovery == "unavailable":
        reason = snapshot.gaps[0] if snapshot.gaps else "no reason given"
        return f"unavailable: {reason}"
    sessions, unowned = len(snapshot.sessions), len(snapshot.unowned)
    return (
        f"{snapshot.discovery}: {sessions} active session{'' if sessions == 1 else 's'}, "
        f"{unowned} unowned process{'' if unowned == 1 else 'es'}; watcher {watcher_mode}"
    )


async def send_watchdog(notifier: Notifier) -> None:
    """Send ``WATCHDOG=1`` every :attr:`Notifier.watchdog_interval_s` until cancelled.

    Returns at once when the watchdog is off. Runs on the event loop, so a loop
    blocked for longer than ``WatchdogSec`` stops the keep-alives and systemd
    restarts the daemon (docs/design.md §8).
    """
    interval_s = notifier.watchdog_interval_s
    if interval_s is None:
        return
    while True:
        notifier.watchdog()
        await anyio.sleep(interval_s)


async def tell_service_manager(
    notifier: Notifier,
    *,
    first_observation: anyio.Event,
    latest: Callable[[], ActiveSessionsSnapshot | None],
    next_answer: Callable[[], Awaitable[None]],
    watcher_mode: Callable[[], str],
) -> None:
    """``READY=1`` once the first observation is done, then ``STATUS=`` whenever
    the one line (:func:`status_text`) changes (docs/design.md §8). Runs until cancelled.

    Args:
        notifier: where the messages go.
        first_observation: set once discovery's first observation is done.
        latest: discovery's latest answer.
        next_answer: returns once discovery publishes a new answer.
        watcher_mode: what the watcher does now.
    """
    status: str | None = None
    await first_observation.wait()
    while True:
        text = status_text(latest(), watcher_mode())
        if text != status:
            if status is None:
                notifier.ready(text)
            else:
                notifier.status(text)
            status = text
        # Woken by a new answer; a fall back to polling shows at the next
        # one, or within a minute (an idle daemon sleeps).
        with anyio.move_on_after(_STATUS_RECHECK_S):
            await next_answer()
