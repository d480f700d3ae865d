"""The home's layout: which directories are entered, which paths matter (docs/design.md §2).

One classifier for the watch, the poller and the reader, so that what is
watched and what is walked cannot drift apart. Paths are given as their
parts relative to the home (the home itself is ``()``).
"""

from __future__ import annotations

import enum
from typing import Final, TypeAlias

__all__ = [
    "EXEC_PARTS",
    "PROVIDER_CLIENTS",
    "RACY_WINDOW_NS",
    "RUNS",
    "SERVERS_PARTS",
    "STORE_FILES",
    "Action",
    "Kind",
    "Parts",
    "action",
    "entered",
    "reader_cares",
    "receipt_kind",
    "walked",
]

Parts: TypeAlias = tuple[str, ...]

RUNS: Final = "runs"
PROVIDER_CLIENTS: Final = "provider-clients"
EXEC_PARTS: Final[Parts] = ("runtime", "exec-processes")
SERVERS_PARTS: Final[Parts] = ("runtime", "opencode-servers.json")
#: The ownership store and its write-ahead log: a commit writes one of them.
STORE_FILES: Final[frozenset[Parts]] = frozenset({("capsule.db",), ("capsule.db-wal",)})
#: A file whose mtime/ctime lies less than this before the moment it was read (or
#: looked at) may change again within the same timestamp tick, leaving the same
#: stamps (git's "racy clean"): the reader re-reads it at its next check, the
#: poller reports it again at its next look (docs/design.md §5). One second covers
#: every Linux file system's timestamp tick and HFS+'s whole seconds.
RACY_WINDOW_NS: Final = 1_000_000_000


def walked(parts: Parts) -> bool:
    """Whether a walk lists the directory at ``parts``.

    ``runs``, ``runs/<run>``, ``runs/<run>/<input>``,
    ``runs/<run>/<input>/provider-clients`` and ``runtime/exec-processes``.
    """
    if parts == EXEC_PARTS:
        return True
    if not parts or parts[0] != RUNS or any(part.startswith(".") for part in parts):
        return False
    return len(parts) <= 3 or (len(parts) == 4 and parts[3] == PROVIDER_CLIENTS)


def entered(parts: Parts) -> bool:
    """Whether the watch and the poller enter the directory at ``parts``.

    Every walked directory, and the two on the way to them that hold the
    store and the servers registry: the home and ``runtime``. Never
    ``sessions/`` (traces are read on request, not watched).
    """
    return parts in ((), ("runtime",)) or walked(parts)


class Kind(enum.Enum):
    """The two kinds of receipt (docs/design.md §2)."""

    PROVIDER_CLIENT = "provider_client"
    EXEC = "exec"


class Action(enum.Enum):
    """What a change at a path asks of the reader (docs/design.md §5 step 1)."""

    IGNORE = enum.auto()  # can never change an answer
    RESCAN = enum.auto()  # a root on the way to the receipts: walk from scratch
    SERVERS = enum.auto()  # the servers registry: read it again
    WALK = enum.auto()  # a walked directory below ``runs``: list it again
    PROVIDER_CLIENT = enum.auto()  # a provider-client receipt: read it
    EXEC = enum.auto()  # an exec receipt: read it


def receipt_kind(parts: Parts) -> Kind | None:
    """The kind of receipt at ``parts``, or None for no receipt's place (docs/design.md §2).

    ``runs/<run>/<input>/provider-clients/<name>.json`` and
    ``runtime/exec-processes/<name>.json``; no part may start with ``.``.
    """
    name = parts[-1] if parts else ""
    if not name.endswith(".json") or name.startswith("."):
        return None
    if len(parts) == 3 and parts[:2] == EXEC_PARTS:
        return Kind.EXEC
    if (
        len(parts) == 5
        and parts[0] == RUNS
        and parts[3] == PROVIDER_CLIENTS
        and not parts[1].startswith(".")
        and not parts[2].startswith(".")
    ):
        return Kind.PROVIDER_CLIENT
    return None


def action(parts: Parts | None) -> Action:
    """What a change at ``parts`` asks of the reader (None: a path outside the home).

    A path outside the home, the home, ``runs``, ``runtime`` and
    ``runtime/exec-processes`` ask for a walk from scratch; names starting
    with ``.`` are invisible anywhere in the path.
    """
    if parts is None:
        return Action.RESCAN
    if any(part.startswith(".") for part in parts):
        return Action.IGNORE
    if parts in ((), (RUNS,), ("runtime",), EXEC_PARTS):
        return Action.RESCAN
    if parts == SERVERS_PARTS:
        return Action.SERVERS
    kind = receipt_kind(parts)
    if kind is Kind.EXEC:
        return Action.EXEC
    if kind is Kind.PROVIDER_CLIENT:
        return Action.PROVIDER_CLIENT
    if parts[0] == RUNS and walked(parts):
        return Action.WALK
    return Action.IGNORE


def reader_cares(parts: Parts) -> bool:
    """Whether a change at ``parts`` can matter to the reader (what the watch reports).

    The reader reads receipts in two places and the servers registry; a
    change to a directory on the way to them makes it walk that directory.
    Everything else (the store, traces, the socket, ``manifest.json``,
    anything below a provider-clients directory or an exec receipt) is noise
    that can never change an answer: :func:`action` says ``IGNORE``.

    Returns:
        ``True`` for ``runs``, ``runs/<run>``, ``runs/<run>/<input>``,
        ``…/provider-clients``, ``…/provider-clients/*.json``, ``runtime``,
        ``runtime/exec-processes``, ``runtime/exec-processes/*.json`` and
        ``runtime/opencode-servers.json``; ``False`` otherwise (the home too).
    """
    return bool(parts) and action(parts) is not Action.IGNORE
