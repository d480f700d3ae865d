"""``capsulectl integrate claude-code``: capsuled's hooks and MCP server in Claude Code's
settings (docs/design.md §12, docs/claude-code.md).

Each scope has a settings file, where Claude Code reads hooks, and a place where it
reads MCP servers — never the settings file, whose ``mcpServers`` Claude Code does not
read (tests/claude_code/FINDINGS.md §10, §11):

* ``user``: hooks in ``~/.claude/settings.json``; the MCP server ``capsuled`` in
  ``~/.claude.json``'s ``mcpServers``;
* ``project``: ``.claude/settings.json`` of the current directory; ``.mcp.json`` there;
* ``local``: ``.claude/settings.local.json`` of the project; ``~/.claude.json``'s
  ``projects[<project>].mcpServers``.

``project`` is the current directory: Claude Code reads a project's
``.claude/settings.json`` only when started in that directory. For ``local`` the
project is the root of the git repository the current directory is in (else the
current directory), as ``claude mcp add --scope local`` keys it, and Claude Code
started anywhere in the repository reads both from there.

The hooks are one command, the ``capsulectl`` that ran ``integrate`` (its absolute
path, shell-quoted) followed by ``hook claude-code``, for each event of
:data:`~.claude_code.HOOK_EVENTS` with its timeout (``PostToolUse`` with the matcher
``Bash|TaskStop``). capsuled's own entries are recognised by that command (any
``capsulectl``, or ``python -m capsule_client.cli``), and the server by its command
and first argument, ``mcp``: a second run changes nothing; ``--remove`` takes out
exactly those, and the containers they leave empty; everything else — other keys,
hooks, servers, their order — stays as it was.

A file is read whole, changed in memory, and written atomically (a temporary file
beside it, fsynced, renamed over it; its mode kept; a symbolic link is followed and
its target written). A file that is not JSON, or not a JSON object, is refused with
the parse error and nothing at all is written. An empty file counts as ``{}``.

What it may import: the standard library and :mod:`.claude_code`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from .claude_code import AGENT, HOOK_EVENTS

__all__ = [
    "SCOPES",
    "SERVER_NAME",
    "FileChange",
    "IntegrateError",
    "Scope",
    "capsulectl_argv",
    "diff",
    "hook_command",
    "is_our_hook",
    "is_our_server",
    "mcp_sdk_present",
    "plan",
    "project_root",
    "scope_places",
    "server_entry",
    "write",
]

ScopeName = Literal["user", "project", "local"]
SCOPES: Final[tuple[ScopeName, ...]] = ("user", "project", "local")
#: The MCP server's name: its tools are ``mcp__capsuled__<tool>`` to Claude Code.
SERVER_NAME: Final = "capsuled"
#: Mode of a file integrate creates: the user's own files 0600, a project's 0644 (shared).
PRIVATE_MODE: Final = 0o600
SHARED_MODE: Final = 0o644


class IntegrateError(Exception):
    """A file integrate will not change (not JSON, not an object, an odd shape); its
    message names the file, says why, and that nothing was written."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Where one scope keeps capsuled's hooks and its MCP server.

    Attributes:
        name: ``user``, ``project`` or ``local``.
        settings: the settings file the hooks go in.
        servers_file: the file the MCP server goes in.
        servers_path: the keys down to the ``mcpServers`` object in it.
        mode: the mode of a file that does not exist yet.
    """

    name: ScopeName
    settings: Path
    servers_file: Path
    servers_path: tuple[str, ...]
    mode: int


def project_root(directory: Path) -> Path:
    """The root of the git repository ``directory`` is in (the nearest directory with a
    ``.git``), else ``directory`` itself."""
    for candidate in (directory, *directory.parents):
        if (candidate / ".git").exists():
            return candidate
    return directory


def scope_places(scope: ScopeName, home: Path, cwd: Path) -> Scope:
    """The files of ``scope`` for the user whose home is ``home``, run in ``cwd``."""
    if scope == "user":
        return Scope(
            scope, home / ".claude" / "settings.json", home / ".claude.json", ("mcpServers",),
            PRIVATE_MODE,
        )  # fmt: skip
    if scope == "project":
        return Scope(
            scope, cwd / ".claude" / "settings.json", cwd / ".mcp.json", ("mcpServers",),
            SHARED_MODE,
        )  # fmt: skip
    root = project_root(cwd)
    return Scope(
        scope, root / ".claude" / "settings.local.json", home / ".claude.json",
        ("projects", str(root), "mcpServers"), PRIVATE_MODE,
    )  # fmt: skip


def capsulectl_argv() -> list[str]:
    """How to run the ``capsulectl`` running now from any shell: the absolute path of its
    script, or, run as ``python -m capsule_client.cli``, that interpreter and module."""
    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) == "capsulectl":
        return [os.path.abspath(script)]
    return [sys.executable, "-m", "capsule_client.cli"]


def hook_command(capsulectl: Sequence[str]) -> str:
    """The hooks' command: ``capsulectl`` (quoted for ``/bin/sh``) ``hook claude-code``."""
    return shlex.join([*capsulectl, "hook", AGENT])


def _runs_capsulectl(argv: Sequence[str]) -> bool:
    """Whether ``argv`` starts a ``capsulectl``: its script, or ``python -m capsule_client.cli``."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == "capsulectl":
        return True
    return list(argv[1:3]) == ["-m", "capsule_client.cli"]


def is_our_hook(entry: object) -> bool:
    """Whether a hook entry is capsuled's: a command that runs ``capsulectl hook claude-code``."""
    if not isinstance(entry, dict) or not isinstance(entry.get("command"), str):
        return False
    try:
        argv = shlex.split(entry["command"])
    except ValueError:
        return False
    cut = 1 if argv and os.path.basename(argv[0]) == "capsulectl" else 3
    return _runs_capsulectl(argv) and argv[cut:] == ["hook", AGENT]


def is_our_server(server: object) -> bool:
    """Whether an MCP server entry is capsuled's: it runs ``capsulectl mcp``."""
    if not isinstance(server, dict) or not isinstance(server.get("command"), str):
        return False
    args = server.get("args")
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        return False
    argv = [server["command"], *args]
    cut = 1 if os.path.basename(argv[0]) == "capsulectl" else 3
    return _runs_capsulectl(argv) and argv[cut : cut + 1] == ["mcp"]


def server_entry(capsulectl: Sequence[str], *, allow_terminate: bool) -> dict[str, Any]:
    """The MCP server as ``claude mcp add`` writes a stdio server."""
    args = [*capsulectl[1:], "mcp", *(["--allow-terminate"] if allow_terminate else [])]
    return {"type": "stdio", "command": capsulectl[0], "args": args, "env": {}}


def mcp_sdk_present() -> bool:
    """Whether ``capsulectl mcp`` can run: the MCP SDK (the extra ``capsuled[mcp]``) is
    importable by this interpreter (found, not imported: that takes most of a second)."""
    import importlib.util

    return importlib.util.find_spec("mcp") is not None


# --------------------------------------------------------------------------
# Changes


@dataclass(slots=True)
class FileChange:
    """What integrate does to one file.

    Attributes:
        path: the file as named (the scope's place).
        before: its JSON object now; None when the file does not exist.
        after: the object it is to hold.
        said: what changes, in words (what stays, when nothing does).
        mode: the mode it is written with: its own, or the scope's for a new file.
    """

    path: Path
    before: dict[str, Any] | None
    after: dict[str, Any]
    said: list[str] = field(default_factory=list)
    mode: int = PRIVATE_MODE

    @property
    def changed(self) -> bool:
        return self.before != self.after if self.before is not None else bool(self.after)


def _read(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when there is no file; ``{}`` for an empty one.

    Raises:
        IntegrateError: not UTF-8, not JSON, or not an object.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise IntegrateError(f"{path}: cannot be read ({exc}); nothing was written") from exc
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise IntegrateError(
            f"{path}: not valid JSON ({exc}); fix it or move it away and run this again. "
            "Nothing was written."
        ) from exc
    if not isinstance(value, dict):
        raise IntegrateError(
            f"{path}: holds a JSON {type(value).__name__}, not an object; nothing was written"
        )
    return value


def _object_at(
    document: dict[str, Any], keys: Sequence[str], path: Path, *, create: bool
) -> dict[str, Any] | None:
    """The object at ``keys`` in ``document`` (made on the way when ``create``)."""
    here = document
    for depth, key in enumerate(keys):
        child = here.get(key)
        if child is None:
            if not create:
                return None
            child = here[key] = {}
        if not isinstance(child, dict):
            where = ".".join(keys[: depth + 1])
            raise IntegrateError(f"{path}: {where} is not an object; nothing was written")
        here = child
    return here


def _prune(document: dict[str, Any], keys: Sequence[str]) -> None:
    """Drop the empty objects along ``keys``, deepest first (capsuled's, once emptied)."""
    for depth in range(len(keys), 0, -1):
        parent = _object_at(document, keys[: depth - 1], Path(), create=False)
        if parent is None:
            continue
        child = parent.get(keys[depth - 1])
        if isinstance(child, dict) and not child:
            del parent[keys[depth - 1]]


def _wanted_group(command: str, timeout_s: int, matcher: str | None) -> dict[str, Any]:
    group: dict[str, Any] = {} if matcher is None else {"matcher": matcher}
    group["hooks"] = [{"type": "command", "command": command, "timeout": timeout_s}]
    return group


def _without_ours(groups: list[Any]) -> tuple[list[Any], int]:
    """``groups`` less capsuled's hook entries (a group left empty goes too); how many."""
    kept: list[Any] = []
    removed = 0
    for group in groups:
        entries = group.get("hooks") if isinstance(group, dict) else None
        if not isinstance(entries, list):
            kept.append(group)
            continue
        others = [entry for entry in entries if not is_our_hook(entry)]
        removed += len(entries) - len(others)
        if len(others) == len(entries):
            kept.append(group)
        elif others:
            kept.append({**group, "hooks": others})
    return kept, removed


def _hooks_change(settings: dict[str, Any], path: Path, command: str, *, remove: bool) -> list[str]:
    """Put capsuled's hooks in ``settings`` (or take them out); what changed, in words."""
    hooks = _object_at(settings, ("hooks",), path, create=not remove)
    if hooks is None:
        return []
    added: list[str] = []
    updated: list[str] = []
    removed: list[str] = []
    for event in HOOK_EVENTS:
        groups = hooks.get(event.name, [])
        if not isinstance(groups, list):
            raise IntegrateError(f"{path}: hooks.{event.name} is not a list; nothing was written")
        label = event.name if event.matcher is None else f"{event.name} ({event.matcher})"
        kept, ours = _without_ours(groups)
        if remove:
            if ours:
                removed.append(label)
                if kept:
                    hooks[event.name] = kept
                else:
                    del hooks[event.name]
            continue
        wanted = _wanted_group(command, event.timeout_s, event.matcher)
        if ours == 1 and wanted in groups:
            continue  # there already, as it would be written
        hooks[event.name] = [*kept, wanted]
        (updated if ours else added).append(label)
    if remove:
        _prune(settings, ("hooks",))
    said = []
    if added:
        said.append(f"added capsuled's hook for {', '.join(added)}")
    if updated:
        said.append(f"updated capsuled's hook for {', '.join(updated)}")
    if removed:
        said.append(f"removed capsuled's hook for {', '.join(removed)}")
    return said


def _server_change(
    document: dict[str, Any],
    path: Path,
    keys: tuple[str, ...],
    entry: dict[str, Any] | None,
    *,
    remove: bool,
) -> list[str]:
    """Register the MCP server in ``document`` at ``keys`` (or take it out)."""
    where = "mcpServers" if len(keys) == 1 else f"projects[{keys[1]!r}].mcpServers"
    servers = _object_at(document, keys, path, create=not remove)
    present = None if servers is None else servers.get(SERVER_NAME)
    if remove:
        if servers is None or not is_our_server(present):
            return []
        del servers[SERVER_NAME]
        _prune(document, keys)
        return [f"removed the MCP server {SERVER_NAME} from {where}"]
    assert servers is not None and entry is not None
    if present == entry:
        return []
    if present is not None and not is_our_server(present):
        return [
            f"left {where}.{SERVER_NAME} as it is: it is not `capsulectl mcp` "
            "(rename it, and run this again, to register capsuled's)"
        ]
    servers[SERVER_NAME] = entry
    verb = "updated" if present is not None else "registered"
    command = shlex.join([entry["command"], *entry["args"]])
    return [f"{verb} the MCP server {SERVER_NAME} (`{command}`) in {where}"]


def plan(
    scope: Scope,
    *,
    remove: bool = False,
    capsulectl: Sequence[str] | None = None,
    server: bool = True,
    allow_terminate: bool = False,
) -> list[FileChange]:
    """What integrate (or ``--remove``) changes in ``scope``'s files: one change per
    file (the settings file first), nothing written yet.

    Args:
        scope: the files (:func:`scope_places`).
        remove: take capsuled's entries out instead.
        capsulectl: how to run ``capsulectl`` (:func:`capsulectl_argv`).
        server: register the MCP server too (False: the SDK is missing).
        allow_terminate: the server offers ``terminate_session``.

    Raises:
        IntegrateError: a file is not a JSON object, or holds an odd shape where
            capsuled's entries go: nothing is to be written.
    """
    argv = capsulectl_argv() if capsulectl is None else list(capsulectl)
    changes: dict[Path, FileChange] = {}

    def change_of(path: Path) -> FileChange:
        if path not in changes:
            before = _read(path)
            mode = scope.mode if before is None else _mode(path)
            after = json.loads(json.dumps(before or {}))
            changes[path] = FileChange(path, before, after, mode=mode)
        return changes[path]

    settings = change_of(scope.settings)
    settings.said += _hooks_change(
        settings.after, scope.settings, hook_command(argv), remove=remove
    )
    if server or remove:
        servers = change_of(scope.servers_file)
        entry = None if remove else server_entry(argv, allow_terminate=allow_terminate)
        servers.said += _server_change(
            servers.after, scope.servers_file, scope.servers_path, entry, remove=remove
        )
    return list(changes.values())


def _mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o7777


# --------------------------------------------------------------------------
# Writing


def write(change: FileChange) -> Path:
    """Write ``change.after`` over its file, atomically; returns the path written (a
    symbolic link's target).

    Raises:
        OSError: the directory or the file could not be written (nothing was replaced).
    """
    target = Path(os.path.realpath(change.path))
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(change.after, indent=2, ensure_ascii=False) + "\n"
    temporary = target.with_name(f".{target.name}.capsuled-{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, change.mode)
    try:
        try:
            os.fchmod(fd, change.mode)  # the umask does not narrow a mode kept
            data = text.encode("utf-8")
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_directory(target.parent)
    return target


def _sync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def diff(change: FileChange) -> Iterator[str]:
    """The change as a unified diff of the two objects written as integrate writes them."""
    import difflib

    def lines(document: dict[str, Any] | None) -> list[str]:
        if document is None:
            return []
        return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").splitlines(True)

    name = str(change.path)
    yield from difflib.unified_diff(
        lines(change.before),
        lines(change.after),
        fromfile=name if change.before is not None else "/dev/null",
        tofile=name,
    )
