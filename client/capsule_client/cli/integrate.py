"""``capsulectl integrate AGENT``: register capsuled's hooks and MCP server in an agent's
own settings, or take them out (docs/design.md §12). ``claude-code`` is the agent there is.

Exit status: 0 done (or nothing to do), 1 a file was refused (not JSON, not an object)
or could not be written, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .exits import EXIT_OK, EXIT_REMOTE_ERROR, EXIT_USAGE

__all__ = ["arguments", "run"]

EPILOG = """\
Claude Code reads hooks from a settings file and MCP servers from elsewhere:
  --scope user     ~/.claude/settings.json, and ~/.claude.json's mcpServers
  --scope project  ./.claude/settings.json and ./.mcp.json (Claude Code reads the
                   project's settings.json only when started in this directory)
  --scope local    .claude/settings.local.json at the git repository's root (else
                   here), and ~/.claude.json's projects[<that directory>].mcpServers
The hooks run this capsulectl (its absolute path) as `capsulectl hook claude-code`;
the MCP server is `capsulectl mcp`, registered only where the MCP SDK is installed
(the extra capsuled[mcp]). Everything else in the files stays as it was."""


def arguments(parser: argparse.ArgumentParser) -> None:
    """``AGENT [--scope S] [--remove] [--dry-run] [--allow-terminate]``."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "agent", metavar="AGENT", choices=("claude-code",), help="the agent: claude-code"
    )
    parser.add_argument(
        "--scope",
        choices=("user", "project", "local"),
        default="user",
        help="whose settings: user (every project of this user; the default), project "
        "(this directory, shared through its repository) or local (this project, this "
        "user only)",
    )
    parser.add_argument(
        "--remove", action="store_true", help="take capsuled's hooks and MCP server out again"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would change; write nothing"
    )
    parser.add_argument(
        "--allow-terminate",
        action="store_true",
        help="register the MCP server as `capsulectl mcp --allow-terminate`: the agent may "
        "stop what its session left running (never itself)",
    )


def run(args: argparse.Namespace, socket_path: Path) -> int:
    """Plan every file's change, refuse before writing any if one is refused, write."""
    from ..agents.claude_code_settings import (
        IntegrateError,
        mcp_sdk_present,
        plan,
        scope_places,
        write,
    )
    from .render.integrate import render_change

    if args.remove and args.allow_terminate:
        print("capsulectl integrate: --allow-terminate does not go with --remove", file=sys.stderr)
        return EXIT_USAGE
    cwd = Path.cwd()
    scope = scope_places(args.scope, Path.home(), cwd)
    server = args.remove or mcp_sdk_present()
    try:
        changes = plan(
            scope, remove=args.remove, server=server, allow_terminate=args.allow_terminate
        )
    except IntegrateError as exc:
        print(f"capsulectl integrate: {exc}", file=sys.stderr)
        return EXIT_REMOTE_ERROR
    for change in changes:
        if change.changed and not args.dry_run:
            try:
                write(change)
            except OSError as exc:
                print(f"capsulectl integrate: {change.path}: not written: {exc}", file=sys.stderr)
                return EXIT_REMOTE_ERROR
        print(render_change(change, remove=args.remove, dry_run=args.dry_run))
    if not server:
        print(
            "The MCP server is not registered: the MCP SDK is not installed for this "
            f"capsulectl ({sys.executable}). Add it (`pipx inject capsuled mcp`, or "
            "`pip install 'capsuled[mcp]'`), then run this again; the hooks work without it."
        )
    if args.scope == "project" and scope.settings.parent.parent != _repository_root(cwd):
        print(
            f"Note: Claude Code reads {scope.settings} only when started in {cwd} itself, "
            "not in the repository's other directories."
        )
    if not args.remove and not args.dry_run and any(change.changed for change in changes):
        print(
            "Claude Code sessions started (or resumed) from now on are listed by "
            "`capsulectl sessions`; capsuled must run for a resume to be told what was lost."
        )
    return EXIT_OK


def _repository_root(directory: Path) -> Path:
    from ..agents.claude_code_settings import project_root

    return project_root(directory)
