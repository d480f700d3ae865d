"""Reconcile: what a prior session detached and never accounted for (docs/design.md §6).

Offers :mod:`.trace_scan` (what a trace says was detached and accounted) and
:mod:`.prior_session` (``reconcile``: the ``shell_lost`` markers, exactly
once, and the ``LostReport``).

May import: the shared leaves only.
"""
