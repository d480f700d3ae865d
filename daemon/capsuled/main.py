"""``capsuled``: the daemon's entry point (docs/design.md §8).

Exit status: 0 after a clean shutdown, 1 when the daemon cannot start, 2 on
bad usage (a malformed flag or environment variable).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

import anyio
import structlog

from capsuled.common.shortage import is_shortage, shortage_gap
from capsuled.discovery import heap
from capsuled.service import logs
from capsuled.service.config import Config, ConfigError, parse_args
from capsuled.service.supervisor import StartupError, Supervisor

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon in the foreground until SIGTERM or SIGINT."""
    # Until the event loop reads signals, SIGHUP (a rescan later) must not
    # kill the daemon; SIGTERM and SIGINT this early find nothing to clean up.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    heap.keep_large_buffers_mapped_apart()  # megabyte replies must not pin the heap
    try:
        config = parse_args(argv)
    except ConfigError as exc:
        print(f"capsuled: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_format, config.log_level)
    log = structlog.get_logger("capsuled")
    try:
        return anyio.run(_serve, config)
    except StartupError as exc:
        log.error("cannot start", error=str(exc))
        return 1
    except OSError as exc:  # before the services run: too short of descriptors to build them
        if not is_shortage(exc):
            raise
        log.error("cannot start", error=shortage_gap(exc.errno, retrying=False))
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        return 130


async def _serve(config: Config) -> int:
    # The supervisor makes anyio primitives, so it is built inside the event loop.
    supervisor = Supervisor(config)
    await supervisor.run()
    return supervisor.lifecycle.exit_status
