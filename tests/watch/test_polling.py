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


CLIENTS = ("runs", "r1", "inp_a", "provider-clients")


def test_a_directory_whose_entries_came_and_went_between_two_looks_is_moved(
    tmp_path: Path,
) -> None:
    directory = tmp_path.joinpath(*CLIENTS)
    directory.mkdir(parents=True)
    past_ns = time.time_ns() - 5_000_000_000
    for depth in range(1, len(CLIENTS) + 1):  # old: no tick's doubt about them
        os.utime(tmp_path.joinpath(*CLIENTS[:depth]), ns=(past_ns, past_ns))
    poller = Poller(str(tmp_path))
    poller.walk()
    assert not poller.walk()  # nothing moved
    transient = directory / "c1.json"
    transient.write_bytes(b"{}")
    transient.unlink()  # the two looks list the same nothing
    look = poller.walk()
    assert look.paths == set()
    assert look.moved == {CLIENTS}
    # Changed less than a tick's doubt before that look: once more, then confirmed.
    assert poller.walk().moved == {CLIENTS}
    assert not poller.walk()


def test_only_walked_directories_are_moved(tmp_path: Path) -> None:
    tmp_path.joinpath("sessions").mkdir()  # entered by nothing
    tmp_path.joinpath("runtime").mkdir()  # entered, but holds no receipt nor directory of them
    poller = Poller(str(tmp_path))
    poller.walk()
    for place in ("sessions", "runtime", ""):
        tmp_path.joinpath(place, "x").write_bytes(b"")
        tmp_path.joinpath(place, "x").unlink()
    assert not poller.walk().moved
