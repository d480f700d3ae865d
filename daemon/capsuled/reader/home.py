"""The home's identity: where it is, whether it is still the same directory, and its paths.

The home is resolved once (symlinks followed); a watcher given the path as
configured reports changes under that alias, which :meth:`Home.unalias`
maps back. Each observation checks that the home is still the directory it
was (docs/design.md §5 home identity) and still strict enough
(docs/design.md §3 strictness).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from capsuled.home.layout import Parts
from capsuled.home.strictness import home_refusal

from .errors import Unavailable, describe, raise_if_short

__all__ = ["GAP_HOME_REPLACED", "Home", "HomeReplaced"]

GAP_HOME_REPLACED: Final = "home directory was replaced or removed"


class HomeReplaced(Unavailable):
    """The home is another directory than the one the reader started with, or gone."""

    def __init__(self) -> None:
        super().__init__(GAP_HOME_REPLACED)


class Home:
    """One home's path, its alias and its identity (device, inode).

    Args:
        home: the capsule home as given; :attr:`path` is it resolved.
    """

    def __init__(self, home: Path) -> None:
        self.path = Path(home).resolve()
        #: The resolved home as text: every absolute path the reader keeps starts with it.
        self.text = str(self.path)
        # The home as given, if symlinks made it differ: a watcher given that
        # path reports changes under it.
        given = os.path.abspath(home)
        self._alias = given if given != self.text else None
        self.uid = os.geteuid()
        try:
            self.identity = self._stat()
        except (Unavailable, OSError):  # reported by the first observation
            self.identity = None

    @property
    def missing(self) -> bool:
        """Whether the home did not exist at the latest check."""
        return self.identity is None

    def missing_gap(self) -> str:
        return f"home {self.text} does not exist; no receipts are read until it is created"

    def check(self) -> bool:
        """Home identity and strictness (docs/design.md §3 strictness, §5 home identity).

        Returns:
            True when the home (re)appeared: a walk of the missing home found
            nothing, and a watch may not see the new one yet, so it is walked
            now, whatever the watcher says.

        Raises:
            HomeReplaced: the home is another directory, or was removed.
            Unavailable: the home is refused or cannot be inspected.
        """
        try:
            identity = self._stat()
        except OSError as exc:
            raise_if_short(exc)
            raise Unavailable(f"home {self.text} cannot be inspected: {describe(exc)}") from exc
        if self.identity is not None and identity != self.identity:
            raise HomeReplaced
        appeared = self.identity is None and identity is not None
        self.identity = identity
        return appeared

    def _stat(self) -> tuple[int, int] | None:
        """The home's identity (device, inode), or None while it is missing.

        The home is looked up by the path it was given (symlinks followed), not
        by the path they resolved to: a symlink removed, or replaced by a
        directory, replaces the home even though its old target still exists.

        Raises:
            Unavailable: the home is refused (docs/design.md §3 strictness); the gap is
                :func:`~capsuled.home.strictness.home_refusal`'s text, the same as at start.
            OSError: the home cannot be inspected.
        """
        try:
            st = os.stat(self.text if self._alias is None else self._alias)
        except FileNotFoundError:
            return None
        refusal = home_refusal(st, self.text, self.uid)
        if refusal is not None:
            raise Unavailable(refusal)
        return st.st_dev, st.st_ino

    def unalias(self, path: str) -> str:
        """``path`` under the home as given, rewritten under the resolved home."""
        alias = self._alias
        if alias is not None and (path == alias or path.startswith(alias + os.sep)):
            return self.text + path[len(alias) :]
        return path

    def parts(self, path: str) -> Parts | None:
        """The parts of ``path`` relative to the home (``()``: the home), None if outside it."""
        if path == self.text:
            return ()
        prefix = self.text + os.sep
        if not path.startswith(prefix):
            return None
        return tuple(path[len(prefix) :].split(os.sep))

    def key(self, path: str) -> str:
        """The candidate key of an absolute path under the home: the path relative to it."""
        return path[len(self.text) + 1 :]

    def join(self, *parts: str) -> str:
        """The absolute path of ``parts`` under the home."""
        return os.path.join(self.text, *parts)
