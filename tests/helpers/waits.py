"""Waiting with deadlines instead of sleeps: a condition polled, a child's output read."""

from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | bool | None],
    *,
    timeout_s: float = 5.0,
    interval_s: float = 0.01,
    message: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {message}")
        time.sleep(interval_s)


class ChildOutput:
    """A child process's pipe, read with deadlines (never a blocking ``readline``).

    Args:
        pipe: the child's ``stdout`` or ``stderr`` (``subprocess.PIPE``); read
            only through this object, so that no bytes wait in another buffer.
    """

    def __init__(self, pipe: Any) -> None:
        self._fd: int = pipe.fileno()
        self.seen = bytearray()  # everything read so far
        self._taken = 0  # bytes of ``seen`` already returned as lines

    def _read_more(self, deadline: float, waiting_for: str) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out waiting for {waiting_for} (read {bytes(self.seen)!r})")
        ready, _, _ = select.select([self._fd], [], [], remaining)
        if ready:
            chunk = os.read(self._fd, 65536)
            if not chunk:
                raise AssertionError(f"the child closed its output before {waiting_for}")
            self.seen += chunk

    def line(self, timeout_s: float = 5.0) -> bytes:
        """The next line, without its newline; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (end := self.seen.find(b"\n", self._taken)) < 0:
            self._read_more(deadline, "a line")
        line = bytes(self.seen[self._taken : end])
        self._taken = end + 1
        return line

    def json(self, timeout_s: float = 5.0) -> Any:
        """The next line, decoded as JSON; fail after ``timeout_s``."""
        return json.loads(self.line(timeout_s))

    def wait_for(self, text: bytes, timeout_s: float = 5.0) -> None:
        """Read until ``text`` has appeared anywhere in the output; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while text not in self.seen:
            self._read_more(deadline, repr(text))
