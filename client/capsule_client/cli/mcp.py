"""``capsulectl mcp``: the MCP server on stdio (docs/design.md §11).

The SDK is imported by this command and no other: :mod:`capsule_client.mcp`
loads it, and only this module imports that.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..wire.constants import DEFAULT_TIMEOUT_S, VERSION
from .exits import EXIT_OK, EXIT_USAGE

__all__ = ["arguments", "run"]


def arguments(parser: argparse.ArgumentParser) -> None:
    """``[--allow-terminate] [--any-session] [--spare-none]``."""
    parser.add_argument(
        "--allow-terminate",
        action="store_true",
        help="offer the tool terminate_session, which stops every process of a session",
    )
    parser.add_argument(
        "--any-session",
        action="store_true",
        help="let terminate_session stop any session, not only the server's own "
        "($CAPSULE_SESSION_ID, else the session that lists its agent host)",
    )
    parser.add_argument(
        "--spare-none",
        action="store_true",
        help="with --allow-terminate: terminate_session stops this agent too (its host, this "
        "server, a launcher); by default it spares them and stops what they left running",
    )


def run(args: argparse.Namespace, socket_path: Path) -> int:
    """Serve MCP on stdio until the agent host closes it; without the SDK, say how to
    install it (exit 2)."""
    if args.spare_none and not args.allow_terminate:
        print("capsulectl: --spare-none applies to --allow-terminate's tool", file=sys.stderr)
        return EXIT_USAGE
    try:
        from ..mcp.server import SESSION_VARIABLE, McpOptions, serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("capsule_client"):
            raise
        print(
            f"capsulectl: `capsulectl mcp` needs the MCP SDK ({exc}), the extra `mcp`. "
            "Installed with pipx: `pipx inject capsuled mcp` (or, in the checkout it was "
            "installed from, `pipx install --force '.[mcp]'`); in a virtual environment "
            "from a checkout: `pip install -e '.[mcp]'` (docs/install.md).",
            file=sys.stderr,
        )
        return EXIT_USAGE
    import anyio

    options = McpOptions(
        socket_path,
        timeout_s=getattr(args, "timeout", DEFAULT_TIMEOUT_S),
        allow_terminate=args.allow_terminate,
        any_session=args.any_session,
        session_id=os.environ.get(SESSION_VARIABLE) or None,
        spare_none=args.spare_none,
    )
    try:
        anyio.run(lambda: serve(options, version=VERSION))
    except KeyboardInterrupt:
        pass
    return EXIT_OK
