"""Agent integrations: one module per agent runtime, each telling capsuled about an
agent's sessions and processes through the runtime's own hooks, for agents nobody
rewrote against the writer kit (Claude Code's hook handler comes here, reached
through ``capsulectl hook claude-code`` and ``capsulectl integrate claude-code``).

A hook runs once per tool call of the agent, so start-up is its budget
(docs/design.md §9): its common path decides with the standard library and loads
msgspec and the rest only when it records something.

What it may import: the clients, the exceptions, the text helpers, ``kit`` and
``wire``; never the command line (which imports it) or the MCP server.
"""
