"""The descriptor budget: the limit raised, then shared out in order (docs/design.md §8)."""

from __future__ import annotations

import resource

from capsuled.processes.descendants import MAX_TRACKED_PIDFDS
from capsuled.service.budget import OWN_MAX, OWN_MIN, open_descriptors, raise_nofile, share


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        assert raise_nofile() == (None if hard == resource.RLIM_INFINITY else hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_small_limit_is_shared_own_first_then_pidfds_then_connections() -> None:
    in_use = open_descriptors()
    budget = share(4096, 1024, limit=in_use + 64)
    assert budget.own == OWN_MIN
    pidfds = budget.exit_pidfds + budget.descendant_pidfds
    assert 0 < budget.connections and 0 < budget.exit_pidfds
    # Nothing is shared out twice: own + pidfds + connections fit the limit.
    assert budget.in_use + budget.own + pidfds + budget.connections <= budget.limit
    assert abs(pidfds - budget.connections) <= 1  # half each of what is left


def test_a_share_asked_for_less_leaves_the_rest_to_the_other() -> None:
    in_use = open_descriptors()
    budget = share(4096, 16, limit=in_use + 1000)
    assert budget.connections == 16
    assert budget.own == OWN_MAX
    pidfds = budget.exit_pidfds + budget.descendant_pidfds
    assert pidfds == 1000 - OWN_MAX - 16
    few = share(8, 1024, limit=in_use + 1000)
    assert few.exit_pidfds == 8  # the rest of the pidfds' half goes to the descendants
    assert few.exit_pidfds + few.descendant_pidfds + few.connections == 1000 - OWN_MAX


def test_a_large_limit_gives_what_was_asked() -> None:
    budget = share(4096, 1024, limit=open_descriptors() + 100_000)
    assert (budget.exit_pidfds, budget.descendant_pidfds, budget.connections) == (
        4096,
        MAX_TRACKED_PIDFDS,
        1024,
    )


def test_a_limit_below_what_is_open_still_serves_one_connection() -> None:
    budget = share(4096, 1024, limit=max(open_descriptors() - 1, 0))
    assert budget.connections == 1
    assert budget.exit_pidfds == budget.descendant_pidfds == 0
