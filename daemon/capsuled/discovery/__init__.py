"""Discovery: the reader observed and its answer served (docs/design.md §5, §7, §8).

Offers :class:`~capsuled.discovery.discovery.Discovery` (the reader, its
exits and looks, verification), :mod:`.wakeups` (when discovery observes
unasked: the wake-ups and the loop on them), :mod:`.commit_wait` (a store
commit still on its way owes an observation), :mod:`.single_flight` (one
observation at a time, shared), :mod:`.latest_answer` (the latest answer,
its listeners and long polls), :mod:`.snapshot_answers` (which observation serves a
``sessions.snapshot`` request), :mod:`.encoded_answer` (the answer's JSON in
parts), :mod:`.subscriptions` (``sessions.subscribe`` and its notifications)
and :mod:`.heap` (freed memory given back after walks).

May import: the reader, processes, the watch's feed, the RPC server's
connection type, the shared leaves; never the handlers or the service.
"""
