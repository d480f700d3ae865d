"""Processes: samples, tables, exits, descendants, argv, terminate (docs/design.md §3, §5, §7).

Offers :mod:`.sample` (the process sample liveness is decided from),
:mod:`.table` (full process tables and the pid counter), :mod:`.exits`
(process exits as pidfd events), :mod:`.descendants` (the descendants
tracker), :mod:`.looks` (the descendant looks between observations),
:mod:`.usage` (CPU and memory for ``usage: true``), :mod:`.argv` and
:mod:`.commands` (each listed process's argv for ``commands: true``) and
:mod:`.terminate` (``session.terminate``'s signalling).

May import: the shared leaves only; it knows nothing of receipts, the watch
or the wire server.
"""
