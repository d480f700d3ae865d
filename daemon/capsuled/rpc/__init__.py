"""The RPC server: sockets, connections, JSON-RPC lines and their params (docs/design.md §7, §8).

Offers :mod:`.server` (the listener, connections, the drain),
:mod:`.connection` (one client's lines in and out), :mod:`.jsonrpc` (the
envelope and dispatch, free of I/O), :mod:`.params` (one method's params
decoded), :mod:`.peers` (peer credentials, -32006), :mod:`.sockets` (bind,
stale socket, mending, removal), :mod:`.activation` (the socket systemd
passed) and :mod:`.lockfile` (one daemon per socket).

May import: :mod:`capsuled.home` and the shared leaves; it knows no method:
the handlers are given to it.
"""
