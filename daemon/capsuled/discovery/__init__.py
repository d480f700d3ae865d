"""Discovery: the reader observed and its answer served (docs/design.md §5, §7, §8).

Offers :class:`~capsuled.discovery.discovery.Discovery`, which ties the
parts together: :mod:`.home_reader` (the home's reader, restarted when the
home is replaced), :mod:`.wakeups` (the asks to observe now, counted),
:mod:`.sampler` (when discovery observes unasked, and verifies),
:mod:`.wake_sources` (exits, descendant looks and :mod:`.commit_wait`, a
store commit still on its way), :mod:`.verification_runs` (their barrier
and what they found), :mod:`.single_flight` (one observation at a time,
shared), :mod:`.latest_answer` (the latest answer, its listeners and long
polls), :mod:`.snapshot_answers` (which observation serves a
``sessions.snapshot`` request), :mod:`.encoded_answer` (the answer's JSON
in parts), :mod:`.subscriptions` (``sessions.subscribe`` and its
notifications) and :mod:`.heap` (freed memory given back after walks). The
composition root builds the parts and passes them in.

May import: the reader, processes, the watch's feed, the RPC server's
connection type, the shared leaves; never the handlers or the service.
"""
