"""The process sample (docs/design.md §3 liveness): one fresh sample, zombies left out."""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil
import pytest
from helpers.processes import Sleepers

from capsuled.processes import sample as processes
from capsuled.processes.sample import matches_start, sample_processes


def test_the_sample_agrees_with_psutil(pool: Sleepers) -> None:
    process = pool.start()
    sample = sample_processes()
    assert sample[os.getpid()] == pytest.approx(psutil.Process().create_time(), abs=0.01)
    assert sample[process.pid] == pytest.approx(psutil.Process(process.pid).create_time(), abs=0.01)


@pytest.mark.parametrize("sampler", [processes._sample_proc, processes._sample_psutil])
def test_zombies_and_the_dead_are_not_in_the_sample(
    pool: Sleepers, sampler: Callable[[], dict[int, float]]
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
    pool.start()
    by_proc = processes._sample_proc()
    by_psutil = processes._sample_psutil()
    shared = by_proc.keys() & by_psutil.keys()
    assert len(shared) >= len(by_proc) - 2  # processes may come and go in between
    assert all(abs(by_proc[pid] - by_psutil[pid]) < 0.011 for pid in shared)


def test_matches_start_uses_the_tolerance() -> None:
    sample = {100: 1000.0}
    assert matches_start(sample, 100, 1003, 3)
    assert matches_start(sample, 100, 997, 3)
    assert not matches_start(sample, 100, 1003.5, 3)
    assert not matches_start(sample, 101, 1000, 3)
