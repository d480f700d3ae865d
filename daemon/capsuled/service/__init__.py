"""The service: the daemon composed, configured, started and stopped (docs/design.md §8).

Offers :mod:`.supervisor` (the composition root: it builds every service and
the method table and runs the one task group), :mod:`.config` (flags and
their environment variables), :mod:`.lifecycle` (the one shutdown state),
:mod:`.notify` (sd_notify and the watchdog), :mod:`.home_setup` (the home
made and checked at start), :mod:`.budget` (the open-file limit raised and
shared out) and :mod:`.logs` (structlog's set-up).

May import: everything below it; only :mod:`capsuled.main` imports it.
"""
