"""The metrics textfile for node_exporter (docs/design.md §8 ``--metrics-textfile``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

import anyio
import structlog
from anyio.abc import TaskStatus
from prometheus_client import write_to_textfile
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

__all__ = ["TEXTFILE_MIN_INTERVAL_S", "TextfileWriter"]

log = structlog.get_logger("capsuled.metrics")

#: The least time between two writes of the metrics textfile, seconds
#: (``capsuled --help`` and docs/design.md §8 say it from here).
TEXTFILE_MIN_INTERVAL_S: Final = 2.0


class _Frozen(Collector):
    """Families collected once (on the event loop), written later (in a worker thread)."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


class TextfileWriter:
    """Writes the metrics for node_exporter's textfile collector (docs/design.md §8).

    The file is replaced atomically (temp file beside it, then rename:
    :func:`prometheus_client.write_to_textfile`) in the Prometheus text
    format, after a change (:meth:`mark`) and at most once every
    ``min_interval_s``; while nothing changes the writer sleeps. A failed
    write is logged once as a warning, retried after ``min_interval_s``
    while it lasts, and is never fatal.

    Args:
        path: the file to write; node_exporter reads only names ending ``.prom``.
        collector: the families to write.
        min_interval_s: the least time between two writes, seconds.
    """

    def __init__(
        self, path: Path, collector: Collector, *, min_interval_s: float = TEXTFILE_MIN_INTERVAL_S
    ) -> None:
        self.path = path
        self._collector = collector
        self.min_interval_s = min_interval_s
        self._changed = anyio.Event()
        self._changed.set()  # the first write: right after start
        self._failing = False
        #: Files written since start.
        self.writes = 0

    def mark(self) -> None:
        """Something the metrics show changed: write the file soon."""
        self._changed.set()

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write the file after each change, at most every ``min_interval_s``, until cancelled."""
        task_status.started()
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            families = list(self._collector.collect())  # on the loop: the figures don't move
            written = await anyio.to_thread.run_sync(self._write, families)
            if not written:
                self._changed.set()  # retried after the interval
            await anyio.sleep(self.min_interval_s)

    def _write(self, families: Sequence[Metric]) -> bool:
        try:
            write_to_textfile(str(self.path), _Frozen(families))
        except OSError as exc:
            if not self._failing:
                log.warning(
                    "cannot write the metrics textfile; retrying",
                    path=str(self.path),
                    error=str(exc),
                    retry_s=self.min_interval_s,
                )
            self._failing = True
            return False
        if self._failing:
            log.info("metrics textfile written again", path=str(self.path))
        self._failing = False
        self.writes += 1
        return True
