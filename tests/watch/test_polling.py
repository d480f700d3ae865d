"""The daemon's own poller: a file written less than a timestamp tick's doubt before a look
is reported once more at the next look (docs/design.md §5 "racy clean", docs/watcher.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from capsuled.watch.polling import Poller

RECEIPT = ("runtime", "exec-processes", "exe_1.json")


def test_a_young_file_is_reported_once_more_then_not_again(tmp_path: Path) -> None:
    path = tmp_path.joinpath(*RECEIPT)
    path.parent.mkdir(parents=True)
    poller = Poller(str(tmp_path))
    assert not poller.walk()  # the first walk only remembers
    path.write_bytes(b"{}")
    assert poller.walk().paths == {RECEIPT}  # written: reported
    # Unchanged as far as a signature can tell, but young at the last look: a second
    # same-size write in the same timestamp tick would look exactly like this.
    assert poller.walk().paths == {RECEIPT}
    assert not poller.walk()  # confirmed by a later look: quiet


def test_an_old_file_rewritten_is_reported_once(tmp_path: Path) -> None:
    path = tmp_path.joinpath(*RECEIPT)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"{}")
    past = time.time() - 5
    os.utime(path, (past, past))  # old; its ctime is not (a ctime cannot be set back)
    poller = Poller(str(tmp_path))
    poller.walk()
    poller.walk()  # the ctime was young at the first look: reported once more
    assert not poller.walk()
    path.write_bytes(b"[]")
    assert poller.walk().paths == {RECEIPT}
