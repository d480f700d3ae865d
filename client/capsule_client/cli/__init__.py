"""``capsulectl``: the command line (docs/design.md §9).

:mod:`.main` parses the command line and runs one command; each command is a
module of its own here (``ping``, ``sessions``, ``run``, ...), imported only
when that command runs, so that a command loads what it uses and nothing else
(no anyio for a request that blocks, no MCP SDK outside ``capsulectl mcp``).
What they print for people is in :mod:`.render`.

What it may import: everything below it in the package (the clients, the
exceptions, the text helpers, ``kit``, ``wire``) and, from ``capsulectl mcp``
only, :mod:`capsule_client.mcp` and :mod:`capsule_client.agents`. Nothing
imports it: the daemon never does (docs/design.md §1).
"""
