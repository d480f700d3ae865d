"""The process sample (docs/design.md §3 liveness): one fresh sample, zombies left out."""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil
import pytest
from helpers.processes import Sleepers

from capsuled.processes import sample as processes
from capsuled.processes.sample import Start, matches_start, sample_processes


def test_the_sample_agrees_with_psutil(pool: Sleepers) -> None:
    process = pool.start()
    sample = sample_processes()
    assert sample[os.getpid()].s == pytest.approx(psutil.Process().create_time(), abs=0.01)
    assert sample[process.pid].s == pytest.approx(
        psutil.Process(process.pid).create_time(), abs=0.01
    )


@pytest.mark.parametrize("sampler", [processes._sample_proc, processes._sample_psutil])
def test_zombies_and_the_dead_are_not_in_the_sample(
    pool: Sleepers, sampler: Callable[[], dict[int, Start]]
) -> None:
    alive, dead, zombie = pool.start(), pool.start(), pool.start()
    assert {alive.pid, dead.pid, zombie.pid} <= sampler().keys()
    pool.kill(dead)
    pool.kill(zombie, reap=False)
    assert os.path.exists(f"/proc/{zombie.pid}")  # still in the process table
    sample = sampler()
    assert alive.pid in sample
    assert dead.pid not in sample
    assert zombie.pid not in sample


def test_both_samplers_agree(pool: Sleepers) -> None:
    """Both list the same live processes, started at the same time.

    The machine's other processes start and end between the two samples (the
    other tests' among them, hundreds at a time): a process only the first
    lists has ended since, as a third sample shows; one only the second lists
    started after the first began, so after the sleep started before it.
    """
    sleeper = pool.start()
    by_proc = processes._sample_proc()
    by_psutil = processes._sample_psutil()
    after = processes._sample_proc()
    shared = by_proc.keys() & by_psutil.keys()
    assert {os.getpid(), sleeper.pid} <= shared
    assert [pid for pid in by_proc.keys() - shared if after.get(pid) == by_proc[pid]] == []
    earliest = by_proc[sleeper.pid].s - 0.011
    assert [pid for pid in by_psutil.keys() - shared if by_psutil[pid].s < earliest] == []
    # A pid ended and handed out again between the two: then the third sample has the new start.
    differ = [pid for pid in shared if abs(by_proc[pid].s - by_psutil[pid].s) >= 0.011]
    assert [pid for pid in differ if after.get(pid) == by_proc[pid]] == []


def test_matches_start_uses_the_tolerance() -> None:
    sample = {100: Start(1000.0)}
    assert matches_start(sample, 100, 1003, 3)
    assert matches_start(sample, 100, 997, 3)
    assert not matches_start(sample, 100, 1003.5, 3)
    assert not matches_start(sample, 101, 1000, 3)
