"""The commit wait: a write transaction seen open wakes discovery once it ends, and one
held for long is asked about at the longer pause (docs/design.md §4)."""

from __future__ import annotations

import itertools

import anyio
import pytest

from capsuled.discovery.commit_wait import (
    FIRST_PAUSE_S,
    LONG_AFTER_S,
    LONG_PAUSE_S,
    MAX_PAUSE_S,
    QUICK_FOR_S,
    CommitWait,
)

pytestmark = pytest.mark.anyio

HELD_S = LONG_AFTER_S + 4 * LONG_PAUSE_S


async def test_a_long_transaction_is_asked_about_at_the_longer_pause_then_wakes_once() -> None:
    asked: list[float] = []
    woken = anyio.Event()
    wakes: list[float] = []
    released_at = anyio.current_time() + HELD_S

    def writing() -> bool:
        asked.append(anyio.current_time())
        return asked[-1] < released_at

    def wake() -> None:
        wakes.append(anyio.current_time())
        woken.set()

    wait = CommitWait(writing=writing, wake=wake)
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait.run)
        wait.owe()
        with anyio.fail_after(HELD_S + 5):
            await woken.wait()
        tg.cancel_scope.cancel()
    assert wakes[0] >= released_at and wait.waits == 1
    started = asked[0]
    early = [t for t in asked if t < started + LONG_AFTER_S]
    late = [t for t in asked if t >= started + LONG_AFTER_S + MAX_PAUSE_S]
    # A pause is never shorter than asked (a loaded machine only makes it longer):
    # every half millisecond during a commit's sync, then doubling.
    quick = [t for t in asked if t < started + QUICK_FOR_S]
    assert len(quick) <= 1 + QUICK_FOR_S / FIRST_PAUSE_S
    assert len(early) <= len(quick) + 10 + LONG_AFTER_S / MAX_PAUSE_S
    # Doubled from the shorter pause up to the longer one (two steps), then at it.
    assert len(late) <= 2 + (HELD_S - LONG_AFTER_S) / LONG_PAUSE_S + 1
    assert all(b - a >= LONG_PAUSE_S * 0.99 for a, b in itertools.pairwise(late[2:]))
