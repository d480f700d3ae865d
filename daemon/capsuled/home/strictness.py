"""The home's strictness (docs/design.md §3 "Strictness"): which homes capsuled refuses, and why.

The rule is decided here once and read at two moments: at start by
:func:`capsuled.service.home_setup.check_home` (a refusal stops the daemon) and on every
observation by :class:`capsuled.reader.ActiveSessionReader` (a refusal is the
snapshot's gap). Both word it with :func:`home_refusal`, whose text names the fix.

This module imports only the standard library, so that both can import it.
"""

from __future__ import annotations

import os
import pwd
import shlex
import stat

__all__ = ["home_refusal", "user_name"]


def home_refusal(st: os.stat_result, home: str | os.PathLike[str], uid: int) -> str | None:
    """Why a home is refused, or ``None`` if it is strict enough (docs/design.md §3 "Strictness").

    Receipts are claims of ownership: anyone who can write them can make a
    process look like part of a session. So the home must be a directory,
    owned by the daemon's user, with neither the group nor the others write bit.

    Args:
        st: the home's status, symbolic links followed (``os.stat``).
        home: the home's path, as the message should name it.
        uid: the daemon's effective uid.

    Returns:
        ``None`` for a strict home; otherwise one sentence naming the home,
        what is wrong with it and the fix (``chmod 0700 …``, ``chown …``).
    """
    if not stat.S_ISDIR(st.st_mode):
        return f"the home {home} is not a directory; move it away or pass another --home"
    if st.st_uid != uid:
        quoted = shlex.quote(os.fspath(home))
        return (
            f"the home {home} is owned by {user_name(st.st_uid)}, not by {user_name(uid)} "
            "who runs capsuled: receipts are claims of ownership, so capsuled reads only a home "
            f"of its own user. Fix: use your own home (--home or CAPSULE_HOME), or "
            f"`chown {uid} {quoted} && chmod 0700 {quoted}`"
        )
    writable = [
        who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit
    ]
    if writable:
        return (
            f"the home {home} is writable by {' and '.join(writable)} "
            f"(mode {stat.S_IMODE(st.st_mode):04o}): anyone who can write it can make a process "
            f"look like part of a session. Fix: `chmod 0700 {shlex.quote(os.fspath(home))}`"
        )
    return None


def user_name(uid: int) -> str:
    """``uid`` as messages name it: ``"uid 1000 (alice)"``, or ``"uid 1000"`` if it has no name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"
