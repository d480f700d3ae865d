"""Which observation answers a plain request once a change was heard (docs/design.md §5, §7).

A wake (a watch event, an exit, a descendant, a commit landed) makes the
latest answer stale until an observation begun after it is published: a
plain request waits for that one, not for one already running. Here the
observations are stand-ins the test releases one by one, so every order is
reached on purpose; the answer selection (``SnapshotAnswers``, ``SingleFlight``,
``Wakeups``) is the real one.
"""

from __future__ import annotations

import anyio
import pytest

from capsule_client.wire import ActiveSessionsSnapshot, DiscoveryCost, SnapshotParams
from capsuled.discovery.latest_answer import LatestAnswer
from capsuled.discovery.single_flight import SingleFlight
from capsuled.discovery.snapshot_answers import SnapshotAnswers
from capsuled.discovery.wakeups import Wakeups

pytestmark = pytest.mark.anyio

DEADLINE_S = 5.0


class Observations:
    """Numbered stand-in observations that publish as discovery's do; a held one
    waits for :meth:`release`."""

    def __init__(self) -> None:
        self.wakeups = Wakeups()
        self.pub = LatestAnswer()
        self.flight = SingleFlight(self.run, lambda: False)
        self.answers = SnapshotAnswers(
            self.flight,
            self.pub,
            default_max_age_s=lambda: float("inf"),
            pending=lambda: False,
            stale_since=lambda: self.wakeups.stale_since,
            sync=None,
        )
        self.begun = 0
        self.hold = False
        self.running = anyio.Event()
        self._release = anyio.Event()

    def release(self) -> None:
        self.hold = False
        self._release.set()

    async def run(self) -> ActiveSessionsSnapshot:
        served = self.wakeups.begin()
        self.begun += 1
        number = self.begun
        self.running.set()
        if self.hold:
            await self._release.wait()
        snapshot = ActiveSessionsSnapshot(
            home="/h",
            observed_at=float(number),
            generation=number,
            task=None,
            discovery="ready",
            sessions=[],
            unowned=[],
            servers=[],
            gaps=[],
            cost=DiscoveryCost(),
        )
        self.pub.publish(snapshot)
        self.wakeups.answered(served)
        return snapshot

    async def plain(self) -> int:
        """A request without params; the generation that answered it."""
        return (await self.answers.snapshot(SnapshotParams())).generation


@pytest.fixture
async def observations() -> Observations:
    return Observations()


async def test_a_wake_makes_the_latest_answer_stale_until_one_begun_after_it(
    observations: Observations,
) -> None:
    async with anyio.create_task_group() as tg:
        observations.flight.task_group = tg
        with anyio.fail_after(DEADLINE_S):
            assert await observations.plain() == 1
            assert await observations.plain() == 1  # nothing heard: the latest serves
            assert observations.wakeups.stale_since is None
            observations.wakeups.wake()
            assert observations.wakeups.stale_since is not None
            assert await observations.plain() == 2  # observed for it
            assert observations.wakeups.stale_since is None
            assert await observations.plain() == 2


async def test_a_wake_while_an_observation_runs_is_not_answered_by_that_one(
    observations: Observations,
) -> None:
    answered: dict[str, int] = {}

    async def ask(name: str) -> None:
        answered[name] = await observations.plain()

    async with anyio.create_task_group() as tg:
        observations.flight.task_group = tg
        with anyio.fail_after(DEADLINE_S):
            assert await observations.plain() == 1
            observations.hold = True
            observations.running = anyio.Event()
            observations.wakeups.wake()
            tg.start_soon(ask, "before")  # begins observation 2, which is held
            await observations.running.wait()
            observations.wakeups.wake()  # heard while observation 2 runs
            tg.start_soon(ask, "after")
            await anyio.wait_all_tasks_blocked()
            assert answered == {}  # neither takes the stale answer 1
            observations.release()
    # The first wake was heard before observation 2 began; the second only after.
    assert answered == {"before": 2, "after": 3}
    assert observations.wakeups.stale_since is None
