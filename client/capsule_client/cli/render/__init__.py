"""What ``capsulectl`` prints for people (docs/design.md §9): the tables (``tables``),
the process tree and the terminal's width (``tree``), the terminate and reconcile
reports (``terminate``, ``reconcile``), following the daemon until interrupted
(``follow``: ``watch`` and ``top``), and the results written as they came (``output``).

Every string that comes from a receipt, a trace or the OS is made inert
(:mod:`capsule_client.text`) before it reaches the terminal. The layouts are
for people and may change; ``--json`` is the stable output.

What it may import: the clients, the exceptions, the text helpers, ``kit`` and
``wire``; never the command modules above it.
"""
