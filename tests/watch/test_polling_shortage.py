"""The poller short of descriptors: nothing reported gone, nothing forgotten (docs/design.md §8)."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from capsuled.watch.polling import Poller


@contextmanager
def no_descriptor_left() -> Iterator[None]:
    """EMFILE for every open of this process (a descriptor number must be below 3)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_look_short_of_descriptors_changes_nothing(tmp_path: Path) -> None:
    receipts = tmp_path / "runtime" / "exec-processes"
    receipts.mkdir(parents=True)
    (receipts / "exe_1.json").write_text("{}")
    run = tmp_path / "runs" / "run1" / "inp_a" / "clients"
    run.mkdir(parents=True)
    (run / "c1.json").write_text("{}")
    poller = Poller(str(tmp_path))
    poller.walk()  # remembers
    poller.walk()  # the files are young: reported once more (a same-tick rewrite looks alike)
    assert poller.walk().paths == set()
    with no_descriptor_left():
        short = poller.walk()
    # Before: every entry was reported changed (gone) here, and again (back) below.
    assert short.paths == set() and not short.store
    again = poller.walk()
    assert again.paths == set(), again.paths
    (receipts / "exe_2.json").write_text("{}")
    assert poller.walk().paths == {("runtime", "exec-processes", "exe_2.json")}
