"""Metrics: the daemon's figures for a fleet (docs/design.md §7, §8 ``--metrics-textfile``).

Offers :mod:`.collector` (the Prometheus collector made from ``status`` and
the latest answer, its exposition, the per-method request figures, the
counts of reconciles and terminations) and :mod:`.textfile` (the
node_exporter textfile writer).

May import: nothing of capsuled: it reads the wire types only.
"""
