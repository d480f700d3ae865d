"""The bounded list of paths that could not be read, and why an observation cannot answer.

An unreadable or unparsable receipt, directory or registry is an error for
its path, listed among the gaps; past :data:`MAX_ERRORS` paths or
:data:`MAX_ERROR_BYTES` of them the observation answers ``unavailable``
instead (docs/design.md §5).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from capsuled.common.shortage import is_shortage, shortage_gap
from capsuled.home.layout import Kind

if TYPE_CHECKING:
    from .candidates import Signature

__all__ = [
    "GAP_TOO_MANY_ERRORS",
    "MAX_ERRORS",
    "MAX_ERROR_BYTES",
    "Errors",
    "ObservationCancelled",
    "PathError",
    "Shortage",
    "Unavailable",
    "describe",
    "raise_if_short",
]

#: Bounds on unresolved paths; past either, the observation fails (docs/design.md §5).
MAX_ERRORS: Final = 4096
MAX_ERROR_BYTES: Final = 4 * 1024 * 1024

GAP_TOO_MANY_ERRORS: Final = (
    "too much unresolved session ownership; repair receipts before retrying"
)


class ObservationCancelled(Exception):
    """The reader's cancel event was set; the observation stopped between two reads.

    The reader owes a rescan afterwards, since its cache may be half updated.
    """


class Unavailable(Exception):
    """This observation cannot answer; the message becomes its gap."""


class Shortage(Unavailable):
    """The daemon, not a path, is short (out of descriptors, of memory): the
    observation fails as a whole and nothing is marked broken (docs/design.md §8).

    Attributes:
        code: the errno that said so.
    """

    def __init__(self, code: int | None) -> None:
        super().__init__(shortage_gap(code))
        self.code = code


def raise_if_short(error: OSError) -> None:
    """Raises: Shortage: ``error`` is the daemon's shortage, not the path's
    (:func:`capsuled.common.shortage.is_shortage`)."""
    if is_shortage(error):
        raise Shortage(error.errno) from error


def describe(error: OSError) -> str:
    """An ``OSError`` as a gap words it: its ``strerror``, else the whole text."""
    return error.strerror or str(error)


@dataclass(slots=True)
class PathError:
    """Why one path could not be read.

    ``kind`` is None for a directory or the servers registry; ``signature``
    lets a later check trust ``stat`` instead of reading the receipt again.
    """

    message: str
    kind: Kind | None
    signature: Signature | None


class Errors:
    """The paths that could not be read, by absolute path, bounded in count and bytes.

    ``revision`` grows by one at each change (an error set, replaced or
    cleared): the projection rebuilds the gaps and the stability check
    (docs/design.md §5 step 4) counts changes by it.
    """

    def __init__(self) -> None:
        self._by_path: dict[str, PathError] = {}
        self._bytes = 0
        self.revision = 0

    def __len__(self) -> int:
        return len(self._by_path)

    def __contains__(self, path: object) -> bool:
        return path in self._by_path

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_path)

    def get(self, path: str) -> PathError | None:
        return self._by_path.get(path)

    def receipts(self) -> list[str]:
        """The paths of the receipts that errored (not directories nor the registry)."""
        return [path for path, error in self._by_path.items() if error.kind is not None]

    def directories(self) -> list[str]:
        """The paths of the errors that are no receipt's (directories, the registry)."""
        return [path for path, error in self._by_path.items() if error.kind is None]

    def gaps(self) -> list[str]:
        """``"<path>: <message>"`` for every error, sorted by path."""
        return [f"{path}: {self._by_path[path].message}" for path in sorted(self._by_path)]

    def set(self, path: str, message: str, kind: Kind | None, signature: Signature | None) -> None:
        """Make ``message`` the error of ``path``; the same message again is no change.

        Raises:
            Unavailable: past :data:`MAX_ERRORS` or :data:`MAX_ERROR_BYTES`
                (:data:`GAP_TOO_MANY_ERRORS`).
        """
        error = self._by_path.get(path)
        if error is not None and error.message == message:
            error.kind, error.signature = kind, signature
            return
        self.clear(path)
        self.revision += 1
        self._by_path[path] = PathError(message, kind, signature)
        self._bytes += _size(path, message)
        if len(self._by_path) > MAX_ERRORS or self._bytes > MAX_ERROR_BYTES:
            raise Unavailable(GAP_TOO_MANY_ERRORS)

    def clear(self, path: str) -> None:
        """``path`` has no error any more (if it had one)."""
        error = self._by_path.pop(path, None)
        if error is not None:
            self.revision += 1
            self._bytes -= _size(path, error.message)

    def clear_under(self, path: str) -> None:
        """Clear the errors of ``path`` and of everything below it."""
        prefix = path + os.sep
        for known in [k for k in self._by_path if k == path or k.startswith(prefix)]:
            self.clear(known)

    def clear_all(self) -> None:
        if self._by_path:
            self.revision += 1
        self._by_path.clear()
        self._bytes = 0


def _size(path: str, message: str) -> int:
    return len(os.fsencode(path)) + len(message.encode())
