"""Whose fault is it: the one classifier of errors that say the daemon, not a path, is short.

``EMFILE`` (this process's descriptor table is full), ``ENFILE`` (the
system's), ``ENOMEM`` and ``ENOBUFS`` say nothing about the file, directory,
process or store being opened: they are the daemon's trouble. Such an error
never marks a receipt broken nor drops one; the observation fails as a
whole with :func:`shortage_gap` as its gap, and the daemon retries by itself
(docs/design.md §8 "Out of descriptors"). Every module that turns an
``OSError`` into a path's error asks :func:`is_shortage` first.
"""

from __future__ import annotations

import errno
import os
from typing import Final

__all__ = [
    "SHORTAGE_ERRNOS",
    "descriptors_short",
    "is_shortage",
    "nofile_limits",
    "shortage_gap",
]

#: The errnos that say the daemon is short of something, not that a path is bad.
SHORTAGE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def is_shortage(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``OSError`` whose errno is in :data:`SHORTAGE_ERRNOS`."""
    return isinstance(exc, OSError) and exc.errno in SHORTAGE_ERRNOS


def descriptors_short() -> bool:
    """Whether the daemon cannot open one more descriptor now.

    For errors that carry no errno (SQLite's "unable to open database
    file"): one ``open`` of ``/dev/null``, closed at once.
    """
    try:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return is_shortage(exc)
    os.close(fd)
    return False


def nofile_limits() -> tuple[int, int] | None:
    """The soft and hard ``RLIMIT_NOFILE`` (``-1``: unlimited); None where there is none."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return int(soft), int(hard)


def shortage_gap(code: int | None, *, retrying: bool = True) -> str:
    """The gap of an observation that failed for a shortage of errno ``code``.

    Names the limit and how to raise it; ``EMFILE`` (or an unknown code)
    is the process's open-file limit. ``retrying`` adds that the daemon
    tries again by itself.
    """
    again = "; the daemon retries by itself" if retrying else ""
    if code == errno.ENFILE:
        return (
            "the system's file table is full (Too many open files in system);"
            f" raise fs.file-max{again}"
        )
    if code in (errno.ENOMEM, errno.ENOBUFS):
        return f"the daemon is short of memory ({os.strerror(code)}){again}"
    limits = nofile_limits()
    limit = "" if limits is None else f" at its limit of {limits[0]}"
    return (
        f"the daemon is out of file descriptors (Too many open files{limit});"
        " raise its open-file limit (LimitNOFILE= in the unit, ulimit -n),"
        f" or lower --max-connections or --max-pidfds{again}"
    )
