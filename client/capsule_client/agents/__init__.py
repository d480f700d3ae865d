"""Agent integrations: one module per agent runtime, each telling capsuled about an
agent's sessions and processes through the runtime's own hooks, for agents nobody
rewrote against the writer kit (docs/design.md §12).

Claude Code: :mod:`.claude_code` (the session id rule, the events, the hook's first
decision: standard library only), :mod:`.claude_code_events` (its hook events as
msgspec types), :mod:`.claude_code_hook` (what each event records),
:mod:`.claude_code_outcome` (where a hook run writes, and what it did),
:mod:`.claude_code_resume` (a resume's reconcile and report) and
:mod:`.claude_code_settings` (``capsulectl integrate claude-code``'s files); reached
through ``capsulectl hook claude-code`` and ``capsulectl integrate claude-code``.

A hook runs once per tool call of the agent, so start-up is its budget
(docs/design.md §9): its common path decides with the standard library and loads
msgspec and the rest only when it records something.

What it may import: the clients, the exceptions, the text helpers, ``kit`` and
``wire``; never the command line (which imports it) or the MCP server.
"""
