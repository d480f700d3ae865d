"""Logging setup: structlog, one JSON object per line on stderr (docs/design.md §8).

Only the daemon's entry point calls :func:`configure`; the client library
never configures logging.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

import msgspec
import structlog

__all__ = ["configure", "stderr_is_journal", "wants_console"]

_encoder = msgspec.json.Encoder(enc_hook=repr)


def _serialize(obj: Any, **_: Any) -> bytes:
    # structlog passes default=...; msgspec's encode takes none.
    return _encoder.encode(obj)


def wants_console(log_format: str) -> bool:
    """Whether to render for people: asked for, or ``auto`` on a terminal.

    ``auto`` means JSON when stderr is not a TTY or goes to the journal
    (``$JOURNAL_STREAM`` names stderr's device and inode; a value inherited
    by a shell in a terminal does not count).
    """
    if log_format != "auto":
        return log_format == "console"
    return sys.stderr.isatty() and not stderr_is_journal()


def configure(log_format: str, level: str) -> None:
    """Route structlog to stderr as JSON lines or console text.

    Args:
        log_format: ``json``, ``console`` or ``auto`` (see :func:`wants_console`).
        level: lowest level to emit, e.g. ``"info"``.
    """
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    level_no = logging.getLevelNamesMapping()[level.upper()]
    if wants_console(log_format):
        processors = [*shared, structlog.dev.ConsoleRenderer()]
        factory: Any = structlog.PrintLoggerFactory(sys.stderr)
    else:
        processors = [
            *shared,
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            structlog.processors.JSONRenderer(serializer=_serialize),
        ]
        factory = structlog.BytesLoggerFactory(sys.stderr.buffer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )


def stderr_is_journal(environ: Mapping[str, str] | None = None, fd: int = 2) -> bool:
    """Whether ``fd`` is the stream systemd connected to the journal.

    ``$JOURNAL_STREAM`` is ``<device>:<inode>`` of that stream (systemd.exec(5));
    it only counts when ``fd`` is still that very file.
    """
    env = os.environ if environ is None else environ
    device, sep, inode = env.get("JOURNAL_STREAM", "").partition(":")
    if not sep or not device.isdigit() or not inode.isdigit():
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))
