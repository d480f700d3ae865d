"""Whether the daemon is stopping: its one shutdown state (docs/design.md §8).

A shutdown is asked for once (SIGTERM, SIGINT, a socket taken over by
another daemon, a test) and read everywhere: the supervisor waits for it,
then drains; handlers and the worker threads they start ask
:meth:`Lifecycle.is_stopping`.
"""

from __future__ import annotations

import anyio

__all__ = ["Lifecycle"]


class Lifecycle:
    """The daemon's shutdown state and its exit status.

    Attributes:
        exit_status: what the process exits with once the daemon stopped: 0,
            or 1 when the socket's path was taken over by another daemon.
    """

    def __init__(self) -> None:
        self._stopping = False  # a plain attribute: read from worker threads too
        self._asked = anyio.Event()
        self.exit_status = 0

    def is_stopping(self) -> bool:
        """Whether a shutdown was asked for; safe to call from any thread."""
        return self._stopping

    def request_shutdown(self, exit_status: int | None = None) -> None:
        """Ask for a graceful shutdown (call on the event loop). Idempotent.

        Args:
            exit_status: the process's exit status, when it is not 0.
        """
        if exit_status is not None:
            self.exit_status = exit_status
        self._stopping = True
        self._asked.set()

    async def stopping(self) -> None:
        """Return once a shutdown was asked for."""
        await self._asked.wait()
