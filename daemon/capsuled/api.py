"""The methods the daemon serves, one coroutine each (SPEC §7).

Each handler takes its decoded params Struct (``capsule_client.protocol``)
and returns a result Struct, or raises :class:`~capsuled.errors.RpcError`.
Blocking work never runs here: handlers hand it to worker threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from capsule_client.protocol import METHOD_PARAMS, NoParams, PingResult, StatusResult

from . import __version__
from .jsonrpc import Handler, Method

if TYPE_CHECKING:
    from .supervisor import Daemon

__all__ = ["Api"]


class Api:
    """Handlers bound to one :class:`~capsuled.supervisor.Daemon`."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def methods(self) -> Mapping[str, Method]:
        """Method name → params type and handler, for the methods served now."""
        handlers: dict[str, Handler] = {
            "ping": self.ping,
            "status": self.status,
        }
        return {name: Method(METHOD_PARAMS[name], handler) for name, handler in handlers.items()}

    async def ping(self, params: NoParams) -> PingResult:
        """``ping`` → ``{"pong": true, "version": ...}``."""
        return PingResult(pong=True, version=__version__)

    async def status(self, params: NoParams) -> StatusResult:
        """``status``: who the daemon is, what it watches, what it has done."""
        daemon = self.daemon
        return StatusResult(
            pid=os.getpid(),
            version=__version__,
            home=str(daemon.config.home),
            socket=str(daemon.config.socket),
            started_at=daemon.started_at,
            uptime_s=round(time.monotonic() - daemon.started_monotonic, 3),
            watcher=daemon.watcher_mode,
            discovery=daemon.discovery,
            last_observed_at=daemon.last_observed_at,
            last_cost=daemon.last_cost,
            totals=daemon.totals,
            clients=daemon.server.clients,
            notes=list(daemon.notes),
        )
