"""Subscriptions: ``sessions.subscribe``, ``.changed``, ``.dropped`` (docs/design.md §7).

A subscription belongs to the connection that made it and ends with it.
Discovery hands every new settled answer (not ``scanning``, a new
generation) to :meth:`SubscriptionHub.publish`; each subscription has one
task that sends its connection what changed since the answer it sent last.

Rules, and why:

* **First the whole answer.** The first ``sessions.changed`` has
  ``full: true`` and every session in ``added``, so a client starts from
  nothing and applies differences from then on. With ``since`` equal to the
  current generation, the client already has the answer: the first
  notification is the next change.
* **Settled.** At most one notification per :data:`SETTLE_S` (20 ms) per
  subscription. The first change after a quiet spell goes out at once (an
  exit reaches the client in the time of one observation); changes within
  the interval are coalesced into the next notification, which carries the
  newest answer.
* **Coalescing, not queueing.** A subscription keeps only the answer it sent
  last (shared with discovery, not copied) and the one notification being
  sent; nothing accumulates, whatever the pace of changes.
* **Dropped when behind.** While a notification waits for the peer to take
  it (the socket buffer is full), each new answer counts; past
  :data:`MAX_UNDELIVERED`, the subscription is dropped: once the waiting
  notification is taken, ``sessions.dropped`` follows and nothing more. A
  peer that takes nothing for the server's write timeout loses its
  connection (a line may have been half written).
* **Commands.** A subscription made with ``commands: true`` sends its
  sessions and unowned processes with their argv (:mod:`capsuled.processes.commands`).
  While one such subscription is open and the latest answer lists a
  process, its task also wakes every :data:`~capsuled.processes.argv.RECHECK_S` to
  check them for an ``exec``: a session one of whose processes now runs
  another program is ``changed`` in the next notification, under the same
  generation (commands are not part of the answer generations count).
* **Ports.** A subscription made with ``ports: true`` sends every process
  with the sockets it listens on (:mod:`capsuled.processes.ports`), read for
  each notification. Opening a socket makes no event the daemon hears, so
  such a subscription checks them every :data:`~capsuled.processes.argv.RECHECK_S`
  too (one reading of ``/proc/net`` a second): a session one of whose
  processes starts or stops listening is ``changed``, under the same
  generation (docs/design.md §13).
* **Unsubscribe.** After the reply to ``sessions.unsubscribe``, no further
  notification of that subscription is sent (one already waiting for the
  send lock goes out before the reply).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import anyio
import msgspec
import structlog

from capsule_client.wire import (
    JSONRPC_VERSION,
    SESSIONS_CHANGED,
    SESSIONS_DROPPED,
    ActiveSessionsSnapshot,
    Notification,
    Session,
    SessionsChanged,
    SessionsDropped,
    StatusTotals,
)
from capsuled.common.tasks import TaskHost
from capsuled.errors import Overloaded, ShuttingDown
from capsuled.processes.argv import RECHECK_S, ArgvCache
from capsuled.processes.commands import with_commands
from capsuled.processes.ports import with_ports

if TYPE_CHECKING:
    from capsuled.rpc.server import Connection

__all__ = [
    "MAX_PER_CONNECTION",
    "MAX_UNDELIVERED",
    "SETTLE_S",
    "SubscriptionHub",
    "changes_between",
]

log = structlog.get_logger("capsuled.subscriptions")

#: Least time between two notifications of one subscription.
SETTLE_S: Final = 0.02
#: New answers a subscription may miss while its notification waits for the
#: peer; one more and it is dropped.
MAX_UNDELIVERED: Final = 16
#: Subscriptions one connection may hold.
MAX_PER_CONNECTION: Final = 16

DROPPED_BEHIND: Final = "fell behind: the client did not read its notifications"

_encoder: Final = msgspec.json.Encoder()


@dataclass(eq=False)
class _Subscription:
    id: str
    connection: Connection
    base: ActiveSessionsSnapshot | None  # the answer sent last; None: send it whole
    commands: bool = False  # processes carry their argv
    ports: bool = False  # processes carry their listening sockets
    replied: anyio.Event = field(default_factory=anyio.Event)
    wake: anyio.Event = field(default_factory=anyio.Event)
    sending: bool = False
    behind: int = 0
    active: bool = True
    dropped: str | None = None


def changes_between(
    before: Iterable[Session], after: Iterable[Session]
) -> tuple[list[Session], list[Session], list[str]]:
    """``(added, changed, removed)`` from one list of sessions to the next.

    ``changed`` holds sessions present in both whose processes or context
    differ, whole; ``removed`` holds ids, sorted.
    """
    old = {session.session_id: session for session in before}
    new = {session.session_id: session for session in after}
    added = [session for key, session in new.items() if key not in old]
    changed = [session for key, session in new.items() if key in old and old[key] != session]
    removed = sorted(key for key in old if key not in new)
    return added, changed, removed


def _notification(
    subscription: str, base: ActiveSessionsSnapshot | None, latest: ActiveSessionsSnapshot
) -> SessionsChanged | None:
    """What to send to go from ``base`` to ``latest``; None if nothing visible changed."""
    added: list[Session]
    changed: list[Session] = []
    removed: list[str] = []
    if base is None:
        added = list(latest.sessions)
    else:
        added, changed, removed = changes_between(base.sessions, latest.sessions)
        if not (added or changed or removed) and (
            base.unowned,
            base.servers,
            base.discovery,
            base.gaps,
        ) == (latest.unowned, latest.servers, latest.discovery, latest.gaps):
            return None
    return SessionsChanged(
        subscription=subscription,
        generation=latest.generation,
        observed_at=latest.observed_at,
        discovery=latest.discovery,
        added=added,
        changed=changed,
        removed=removed,
        unowned=latest.unowned,
        servers=latest.servers,
        gaps=latest.gaps,
        full=base is None,
    )


def _encode(method: str, params: object) -> bytes:
    return _encoder.encode(Notification(jsonrpc=JSONRPC_VERSION, method=method, params=params))


class SubscriptionHub(TaskHost):
    """Every open subscription, fed by discovery's settled answers.

    Args:
        latest: returns discovery's latest settled answer (None before the first).
        totals: the daemon's counters (``subscriptions_dropped``).
        argv: where subscriptions with ``commands`` read the argv (None: a
            cache of the hub's own).
    """

    def __init__(
        self,
        latest: Callable[[], ActiveSessionsSnapshot | None],
        totals: StatusTotals | None = None,
        argv: ArgvCache | None = None,
    ) -> None:
        self._latest = latest
        self.totals = StatusTotals() if totals is None else totals
        self._argv = ArgvCache() if argv is None else argv
        super().__init__()
        self._subscriptions: dict[str, _Subscription] = {}

    @property
    def count(self) -> int:
        """Subscriptions open now (dropped ones are gone from the count at once)."""
        return sum(1 for sub in self._subscriptions.values() if sub.active)

    def publish(self, snapshot: ActiveSessionsSnapshot) -> None:
        """A new settled answer: wake every subscription (discovery's listener)."""
        for sub in list(self._subscriptions.values()):
            if not sub.active:
                continue
            if sub.sending:
                sub.behind += 1
                if sub.behind > MAX_UNDELIVERED:
                    self._drop(sub, DROPPED_BEHIND)
            sub.wake.set()

    def subscribe(
        self,
        connection: Connection,
        since: int | None,
        commands: bool = False,
        *,
        ports: bool = False,
    ) -> str:
        """Open a subscription on ``connection``; its first notification follows the reply.

        With ``commands``, its processes carry their argv (docs/design.md §5);
        with ``ports``, their listening sockets (docs/design.md §13).

        Raises:
            Overloaded: the connection holds :data:`MAX_PER_CONNECTION` already.
            ShuttingDown: the hub is not running.
        """
        if self._tg is None:
            raise ShuttingDown("shutting down: no new subscriptions")
        held = sum(
            1 for sub in self._subscriptions.values() if sub.connection is connection and sub.active
        )
        if held >= MAX_PER_CONNECTION:
            raise Overloaded(
                f"overloaded: a connection may hold {MAX_PER_CONNECTION} subscriptions"
            )
        latest = self._latest()
        base = latest if latest is not None and since == latest.generation else None
        sub = _Subscription(f"sub_{secrets.token_hex(8)}", connection, base, commands, ports)
        self._subscriptions[sub.id] = sub
        connection.call_after_reply(sub.replied.set)
        self._tg.start_soon(self._run, sub)
        return sub.id

    def unsubscribe(self, connection: Connection, subscription: str) -> bool:
        """End ``subscription`` if it is an open one of ``connection``."""
        sub = self._subscriptions.get(subscription)
        if sub is None or sub.connection is not connection or not sub.active:
            return False
        sub.active = False
        sub.wake.set()
        return True

    def _drop(self, sub: _Subscription, reason: str) -> None:
        sub.active = False
        sub.dropped = reason
        self.totals.subscriptions_dropped += 1
        log.warning(
            "subscription dropped",
            subscription=sub.id,
            connection=sub.connection.number,
            reason=reason,
        )

    async def _run(self, sub: _Subscription) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._end_with_connection, sub, tg.cancel_scope)
                if sub.commands or sub.ports:
                    tg.start_soon(self._recheck, sub)
                await self._deliver(sub)
                tg.cancel_scope.cancel()
        finally:
            sub.active = False
            self._subscriptions.pop(sub.id, None)

    @staticmethod
    async def _end_with_connection(sub: _Subscription, scope: anyio.CancelScope) -> None:
        await sub.connection.closed.wait()
        scope.cancel()

    async def _recheck(self, sub: _Subscription) -> None:
        """Wake ``sub`` every :data:`RECHECK_S` while the latest answer lists a process
        (an ``exec``, a socket opened or closed: nothing the daemon hears of)."""
        while True:
            await anyio.sleep(RECHECK_S)
            latest = self._latest()
            if latest is not None and (latest.unowned or latest.sessions):
                sub.wake.set()

    async def _deliver(self, sub: _Subscription) -> None:
        await sub.replied.wait()
        if sub.base is not None:  # what the client has, as it will be compared
            sub.base = await self._with_asked(sub, sub.base)
        if sub.base is None and self._latest() is not None:
            sub.wake.set()  # the whole answer first
        while True:
            await sub.wake.wait()
            sub.wake = anyio.Event()
            if sub.dropped is not None:
                await self._send(sub, SESSIONS_DROPPED, SessionsDropped(sub.id, sub.dropped))
                return
            if not sub.active:
                return
            latest = self._latest()
            if latest is None:
                continue
            latest = await self._with_asked(sub, latest)
            params = _notification(sub.id, sub.base, latest)
            if params is None:
                continue
            sub.behind = 0
            if not await self._send(sub, SESSIONS_CHANGED, params):
                return
            sub.base = latest
            await anyio.sleep(SETTLE_S)

    async def _with_asked(
        self, sub: _Subscription, answer: ActiveSessionsSnapshot
    ) -> ActiveSessionsSnapshot:
        """``answer`` with what ``sub`` asked its processes to carry: argv, ports."""
        if sub.commands:
            answer = await with_commands(answer, self._argv)
        if sub.ports:
            answer = await with_ports(answer)
        return answer

    @staticmethod
    async def _send(sub: _Subscription, method: str, params: object) -> bool:
        sub.sending = True
        try:
            sent = await sub.connection.send_line(_encode(method, params))
        finally:
            sub.sending = False
        if not sent:
            # Gone, or stuck past the write timeout with a line perhaps half
            # written: the connection cannot carry another message.
            sub.connection.end_reading()
        return sent
