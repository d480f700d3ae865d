"""The change feed: what the watch hands the reader (docs/design.md §5)."""

from __future__ import annotations

from pathlib import Path

from capsuled.watch.changes import ChangeFeed


def test_the_store_flag_alone_is_taken_and_nothing_else_is() -> None:
    feed = ChangeFeed()
    assert not feed.take_store_alone()  # nothing recorded
    feed.store_changed()
    assert feed.store_alone  # asked, not taken
    assert feed.take_store_alone()
    assert not feed.store_alone
    assert not feed
    for other in (
        lambda: feed.add([Path("/h/runtime/exec-processes/e.json")]),
        feed.request_rescan,
        feed.home_changed,
        lambda: feed.add_moved([Path("/h/runs")]),
    ):
        other()
        feed.store_changed()
        assert not feed.store_alone
        assert not feed.take_store_alone()  # with anything else, the observation reads it all
        changes = feed.drain()
        assert changes.store and changes
        assert not feed
