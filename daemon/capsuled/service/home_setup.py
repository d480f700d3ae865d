"""The home at start: made if missing, then checked (docs/design.md §3 "Strictness").

The rule itself is :func:`capsuled.home.strictness.home_refusal`, which the reader also
applies on every observation; here a refusal stops the daemon from starting.
"""

from __future__ import annotations

import os
from pathlib import Path

from capsule_client.kit.paths import make_private_dirs
from capsuled.home.strictness import home_refusal
from capsuled.startup_errors import UnsafeHome

__all__ = ["check_home", "ensure_home"]


def ensure_home(home: Path) -> list[Path]:
    """Create the home if it is missing, then check it (:func:`check_home`).

    A missing home, and any missing parent, is created with mode 0700 (what the
    XDG base directory specification asks for), so that a first start on a
    fresh machine works.

    Returns:
        The directories it made, outermost first (a refused start removes them:
        ``capsule_client.kit.paths.remove_made_dirs``).

    Raises:
        UnsafeHome: the home cannot be created, or fails :func:`check_home`.
    """
    try:
        made = make_private_dirs(home)
    except OSError as exc:
        raise UnsafeHome(f"cannot create the home {home}: {exc.strerror or exc}") from exc
    check_home(home)
    return made


def check_home(home: Path) -> None:
    """Refuse a home that another user could write receipts into (docs/design.md §3).

    The home (symbolic links followed) must be a directory, owned by the
    effective uid, with neither the group nor the others write bit; the rule
    and its wording are :func:`capsuled.home.strictness.home_refusal`, which the reader
    applies on every observation too.

    Raises:
        UnsafeHome: the home cannot be inspected, or is refused, with a message
            that names the fix (``chmod 0700 …``).
    """
    try:
        st = os.stat(home)
    except OSError as exc:
        raise UnsafeHome(f"cannot use the home {home}: {exc.strerror or exc}") from exc
    refusal = home_refusal(st, home, os.geteuid())
    if refusal is not None:
        raise UnsafeHome(refusal)
