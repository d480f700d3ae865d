"""A service that runs its own tasks: one task group, open while the service serves.

The exit watch and the subscriptions start a task per watched process or
per subscriber; each runs them in a task group of its own, opened by
``serve`` (launched with ``tg.start`` by the supervisor) and cancelled with it.
"""

from __future__ import annotations

import anyio
from anyio.abc import TaskGroup, TaskStatus

__all__ = ["TaskHost"]


class TaskHost:
    """Base of a service whose tasks run in its own task group while :meth:`serve` runs.

    ``self._tg`` is that task group, None before ``serve`` starts and after it
    ends; a subclass starts its tasks there and cleans up in :meth:`_stopped`.
    """

    def __init__(self) -> None:
        self._tg: TaskGroup | None = None

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the service's tasks until cancelled, then :meth:`_stopped`."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None
            self._stopped()

    def _stopped(self) -> None:
        """Clean up once the task group has ended (nothing by default)."""
