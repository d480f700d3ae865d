"""The watch: changes under the home, as they happen, into the reader's feed (docs/design.md §8).

Offers :class:`~capsuled.watch.watcher.HomeWatcher` (the service: modes,
restarts, the fallback to polling), its backends — :mod:`.inotify` (the
Linux native watch), :mod:`.watchfiles_native` (the native watch elsewhere),
:mod:`.polling` (the daemon's own ``lstat`` poller) — :mod:`.changes` (the
change feed, the hand-over point to the reader) and :mod:`.cookies` (the
read-your-writes barrier through a native watch).

May import: :mod:`capsuled.home` and the shared leaves; never the reader,
discovery or anything above them.
"""
