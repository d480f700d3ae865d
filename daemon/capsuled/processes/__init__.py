"""Processes: samples, identity, exits, descendants, argv, terminate (docs/design.md §3-§7, §14).

Offers :mod:`.sample` (the process sample liveness is decided from),
:mod:`.identity` (which process is which: a start by its ticks, which no
clock step moves, and the one place the boot time is read; docs/design.md
§14), :mod:`.table` (full process tables and the pid counter), :mod:`.exits`
(process exits as pidfd events), :mod:`.descendants` (the descendants
tracker), :mod:`.looks` (the descendant looks between observations),
:mod:`.usage` (CPU and memory for ``usage: true``), :mod:`.argv` and
:mod:`.commands` (each listed process's argv for ``commands: true``) and
:mod:`.terminate` (``session.terminate``'s signalling).

May import: the shared leaves only; it knows nothing of receipts, the watch
or the wire server.
"""
