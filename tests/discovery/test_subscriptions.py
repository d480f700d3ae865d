"""The I/O-free halves of subscriptions: the daemon's differences, the client's core."""

from __future__ import annotations

import json

import pytest

from capsule_client import SubscriptionDropped
from capsule_client.base import MAX_QUEUED_NOTIFICATIONS, ClientCore
from capsule_client.wire import Session, SessionProcess
from capsuled.discovery.subscriptions import changes_between
from capsuled.watch.changes import ChangeFeed


def session(session_id: str, *pids: int) -> Session:
    return Session(
        session_id, None, [SessionProcess(kind="process", pid=p, started_at=1) for p in pids]
    )


def test_changes_between_lists_added_changed_and_removed_whole() -> None:
    before = [session("ses_a", 1), session("ses_b", 2), session("ses_c", 3)]
    after = [session("ses_a", 1), session("ses_b", 2, 4), session("ses_d", 5)]
    added, changed, removed = changes_between(before, after)
    assert added == [session("ses_d", 5)]
    assert changed == [session("ses_b", 2, 4)]
    assert removed == ["ses_c"]
    assert changes_between(after, after) == ([], [], [])


def notification(method: str, **params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()


def changed(subscription: str, generation: int) -> bytes:
    return notification(
        "sessions.changed",
        subscription=subscription,
        generation=generation,
        observed_at=1.0,
        discovery="ready",
        added=[],
        changed=[],
        removed=[],
        unowned=[],
        servers=[],
        gaps=[],
    )


def test_the_core_keeps_notifications_that_arrive_while_a_reply_is_awaited() -> None:
    core = ClientCore("/nonexistent.sock")
    core.subscribed("sub_1")
    assert core.read_reply(7, changed("sub_1", 3)) is None
    assert core.read_reply(7, changed("sub_other", 4)) is None  # not ours: ignored
    core.read_notification(changed("sub_1", 5))
    assert core.read_reply(7, b'{"jsonrpc":"2.0","id":7,"result":{"pong":true}}') is not None
    first, second = core.next_change("sub_1"), core.next_change("sub_1")
    assert first is not None and second is not None
    assert (first.generation, second.generation) == (3, 5)
    assert core.next_change("sub_1") is None
    core.read_notification(
        notification("sessions.dropped", subscription="sub_1", reason="fell behind")
    )
    with pytest.raises(SubscriptionDropped, match="fell behind"):
        core.next_change("sub_1")
    core.read_notification(changed("sub_1", 6))  # forgotten once dropped
    assert core.next_change("sub_1") is None


def test_a_core_that_overflows_ends_the_subscription_instead_of_skipping() -> None:
    core = ClientCore("/nonexistent.sock")
    core.subscribed("sub_1")
    for generation in range(MAX_QUEUED_NOTIFICATIONS + 1):
        core.read_notification(changed("sub_1", generation))
    with pytest.raises(SubscriptionDropped, match="unread"):
        core.next_change("sub_1")


def test_the_feed_calls_its_listener_and_keeps_store_writes_pending() -> None:
    feed = ChangeFeed()
    calls: list[None] = []
    feed.listener = lambda: calls.append(None)
    feed.store_changed()
    assert feed and len(calls) == 1
    changes = feed.drain()
    assert changes.store and not changes.paths and not changes.rescan
    assert not feed
