"""``capsulectl mcp``: an MCP server on stdio that gives an agent capsuled's answers
(docs/design.md §11): the server and its tools (:mod:`.server`), their output models
and the texts for a model (:mod:`.answers`).

Built on the official SDK (``mcp``, the extra ``capsuled[mcp]``), which brings
pydantic; importing any part of it loads all of it. So only the command
``capsulectl mcp`` imports this package, and only this package imports the SDK.

What it may import: the SDK, the async client, the exceptions, the text helpers,
``kit`` and ``wire``; never the command line above it.
"""
