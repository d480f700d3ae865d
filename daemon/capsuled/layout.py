"""The home's layout: which directories are entered, which paths matter (docs/design.md §2).

One classifier for the watch, the poller and the reader, so that what is
watched and what is walked cannot drift apart. Paths are given as their
parts relative to the home (the home itself is ``()``).
"""

from __future__ import annotations

from typing import Final, TypeAlias

__all__ = [
    "EXEC_PARTS",
    "PROVIDER_CLIENTS",
    "RUNS",
    "SERVERS_PARTS",
    "STORE_FILES",
    "Parts",
    "entered",
    "reader_cares",
    "walked",
]

Parts: TypeAlias = tuple[str, ...]

RUNS: Final = "runs"
PROVIDER_CLIENTS: Final = "provider-clients"
EXEC_PARTS: Final[Parts] = ("runtime", "exec-processes")
SERVERS_PARTS: Final[Parts] = ("runtime", "opencode-servers.json")
#: The ownership store and its write-ahead log: a commit writes one of them.
STORE_FILES: Final[frozenset[Parts]] = frozenset({("capsule.db",), ("capsule.db-wal",)})


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


def reader_cares(parts: Parts) -> bool:
    """Whether a change at ``parts`` can matter to the reader.

    The reader reads receipts in two places and the servers registry; a
    change to a directory on the way to them makes it walk that directory.
    Everything else (the store, traces, the socket, ``manifest.json``,
    anything below a provider-clients directory or an exec receipt) is noise
    that can never change an answer. Names starting with ``.`` are invisible
    anywhere in the path.

    Returns:
        ``True`` for ``runs``, ``runs/<run>``, ``runs/<run>/<input>``,
        ``…/provider-clients``, ``…/provider-clients/*.json``, ``runtime``,
        ``runtime/exec-processes``, ``runtime/exec-processes/*.json`` and
        ``runtime/opencode-servers.json``; ``False`` otherwise (the home too).
    """
    if not parts or any(part.startswith(".") for part in parts):
        return False
    depth = len(parts)
    if parts[0] == RUNS:
        if depth <= 3:
            return True
        if parts[3] != PROVIDER_CLIENTS:
            return False
        return depth == 4 or (depth == 5 and parts[4].endswith(".json"))
    if parts[0] == "runtime":
        if depth == 1:
            return True
        if parts[1] == SERVERS_PARTS[1]:
            return depth == 2
        if parts[1] != EXEC_PARTS[1]:
            return False
        return depth == 2 or (depth == 3 and parts[2].endswith(".json"))
    return False
