"""Giving freed memory back to the OS under glibc, so the daemon's RSS follows what it keeps.

Two habits of glibc's allocator make the daemon's resident size much larger
than what it keeps:

* a walk from scratch frees about as much as the cache keeps (decoded
  receipts, ``stat`` results, directory listings), in the worker thread's
  own arena, and glibc keeps freed pages mapped: :func:`trim` after a walk
  hands them back (``malloc_trim(0)`` covers every arena);
* an encoded snapshot is megabytes (one per observation that changed the
  answer; replies are sent from it, not copied). After the first such buffer
  is freed, glibc raises its mmap threshold to that size (up to 32 MiB), so
  later ones come from the heap and their pages stay mapped after they are
  freed: :func:`keep_large_buffers_mapped_apart` pins the threshold at
  128 KiB, so each large buffer is unmapped when freed.

What they save is in docs/benchmark-profiles.md ("Figures behind the code").
Elsewhere (macOS, musl) both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Final

__all__ = ["keep_large_buffers_mapped_apart", "trim"]

#: glibc ``mallopt`` parameter number of ``M_MMAP_THRESHOLD``.
_M_MMAP_THRESHOLD: Final = -3
#: Allocations at least this large get their own mapping (glibc's default start).
MMAP_THRESHOLD_BYTES: Final = 128 * 1024


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


_LIBC: Final = _libc()


def trim() -> None:
    """Return freed heap pages of every arena to the OS (``malloc_trim(0)``)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def keep_large_buffers_mapped_apart() -> None:
    """Pin glibc's mmap threshold, so that freed large buffers are unmapped at once."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
