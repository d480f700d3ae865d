"""capsuled's benchmarks: the numbers we steer by, each against a baseline in the same run.

Run from the repository root (outside the test suite)::

    .venv/bin/python -m benchmarks            # full sizes; rewrites docs/benchmarks.md
    .venv/bin/python -m benchmarks --quick    # small sizes, under a minute; prints only
    make bench / make bench-quick

Each scenario (``benchmarks.scenarios``) runs the real daemon and its baseline
side by side, prints a table with ratios, and judges its targets: met,
MISSED, or "not measured" with the reason.
"""
