"""The sessions methods: snapshot, subscribe, unsubscribe, rescan (docs/design.md §5, §7)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from capsule_client.wire import (
    NoParams,
    RescanResult,
    SnapshotParams,
    SubscribeParams,
    SubscribeResult,
    UnsubscribeParams,
    UnsubscribeResult,
)
from capsuled.discovery.discovery import Discovery
from capsuled.discovery.subscriptions import SubscriptionHub
from capsuled.errors import InternalError
from capsuled.rpc.jsonrpc import Encoded
from capsuled.rpc.server import Connection, current_connection

__all__ = ["rescan_handler", "snapshot_handler", "subscribe_handler", "unsubscribe_handler"]

log = structlog.get_logger("capsuled.handlers")


def snapshot_handler(discovery: Discovery) -> Callable[[SnapshotParams], Awaitable[Encoded]]:
    """The ``sessions.snapshot`` handler: active sessions and their processes.

    An ``unavailable`` observation is answered as a snapshot (not an
    error): its gaps say why. The result is the encoded
    ``ActiveSessionsSnapshot``, kept by discovery for the latest answer.
    The handler raises ``ShuttingDown`` once discovery stopped observing,
    ``InternalError`` when the observation failed on a defect.
    """

    async def snapshot(params: SnapshotParams) -> Encoded:
        connection = current_connection.get(None)
        if connection is None:
            return Encoded(await discovery.snapshot_json(params))
        # It may wait (an observation, or a long poll for a change): a client
        # that left must not hold its slot.
        encoded = await connection.unless_peer_leaves(lambda: discovery.snapshot_json(params))
        return Encoded(encoded)

    return snapshot


def rescan_handler(
    request_rescan: Callable[[], None],
) -> Callable[[NoParams], Awaitable[RescanResult]]:
    """The ``reader.rescan`` handler: the next observation walks the home from scratch."""

    async def rescan(params: NoParams) -> RescanResult:
        request_rescan()
        return RescanResult(scheduled=True)

    return rescan


def subscribe_handler(
    hub: SubscriptionHub,
) -> Callable[[SubscribeParams], Awaitable[SubscribeResult]]:
    """The ``sessions.subscribe`` handler: ``sessions.changed`` on this connection.

    The handler raises ``Overloaded`` when the connection holds too many
    subscriptions, ``ShuttingDown`` when the daemon is stopping.
    """

    async def subscribe(params: SubscribeParams) -> SubscribeResult:
        connection = _connection()
        subscription = hub.subscribe(connection, params.since, params.commands, ports=params.ports)
        log.debug("subscribed", subscription=subscription, connection=connection.number)
        return SubscribeResult(subscription=subscription)

    return subscribe


def unsubscribe_handler(
    hub: SubscriptionHub,
) -> Callable[[UnsubscribeParams], Awaitable[UnsubscribeResult]]:
    """The ``sessions.unsubscribe`` handler: no notification of it follows the reply.

    Answers ``unsubscribed: false`` for a subscription this connection does
    not hold (already dropped or ended, or another connection's).
    """

    async def unsubscribe(params: UnsubscribeParams) -> UnsubscribeResult:
        done = hub.unsubscribe(_connection(), params.subscription)
        return UnsubscribeResult(unsubscribed=done)

    return unsubscribe


def _connection() -> Connection:
    connection = current_connection.get(None)
    if connection is None:  # only the server calls handlers
        raise InternalError("subscriptions need a connection")
    return connection
