"""The poller and the reader together: the reader reads later than the look that
reported a change, and what it read then is not left behind when it goes before the
next look (docs/watcher.md, moved directories)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.processes import sleepers
from helpers.world import World

from capsuled.reader import ActiveSessionReader
from capsuled.watch.polling import Poller


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with sleepers() as pool:
        yield World(tmp_path / "home", pool)


class Polled:
    """A home's poller feeding a reader that trusts it, as ``--watch polling`` runs them."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.poller = Poller(str(world.home))
        self.poller.walk()  # the first walk only remembers
        self.reader = ActiveSessionReader(world.home, world.feed, trust_watcher=True)
        self.reader.observe()  # and the reader walks from scratch

    def look(self) -> None:
        self.poller.walk().feed(self.world.feed, str(self.world.home))

    def receipts(self) -> set[str]:
        snapshot = self.reader.observe().snapshot
        assert snapshot.discovery == "ready", snapshot.gaps
        return {process.receipt for process in snapshot.unowned}


def test_a_receipt_read_again_after_the_look_and_gone_before_the_next_is_dropped(
    world: World,
) -> None:
    pid = world.pool.start().pid
    receipt = world.client_receipt("inp_a", pid, client="c5")
    polled = Polled(world)
    key = "runs/run1/inp_a/provider-clients/c5.json"
    assert polled.receipts() == {key}
    receipt.unlink()
    polled.look()  # reports it gone
    world.client_receipt("inp_a", pid, client="c5")  # written again before the reader reads
    assert polled.receipts() == {key}  # read after the look, present
    receipt.unlink()
    polled.look()  # the look before and this one both list it absent
    assert polled.receipts() == set()


def test_a_directory_listed_after_the_look_and_emptied_before_the_next_is_dropped(
    world: World,
) -> None:
    pid = world.pool.start().pid
    world.client_receipt("inp_a", pid, client="c0")
    polled = Polled(world)
    directory = world.home / "runs" / "run1" / "inp_a" / "provider-clients"
    replacement = directory.with_name(".replacement")  # hidden: entered by nothing
    replacement.mkdir()
    os.rename(directory, directory.with_name(".old"))
    os.rename(replacement, directory)  # a new inode, empty
    shutil.rmtree(directory.with_name(".old"))
    polled.look()  # reports the replaced directory, which the reader lists again
    receipt = world.client_receipt("inp_a", pid, client="c5")
    assert polled.receipts() == {"runs/run1/inp_a/provider-clients/c5.json"}
    receipt.unlink()
    polled.look()  # it listed the directory empty, and lists it empty again
    assert polled.receipts() == set()


def test_an_input_moved_away_while_the_reader_reads_and_back_before_the_next_look_is_read(
    world: World,
) -> None:
    """The reader reads later than the look: it finds a receipt gone that the look saw
    (its input moved away meanwhile); the input is back, as it was, before the next
    look, which then sees nothing to report in it. The reader lists the receipt where
    it is each time all the same: the run's listing differs, and the input's listing
    lost an entry."""
    pid = world.pool.start().pid
    world.client_receipt("inp_a", pid, client="c0")
    polled = Polled(world)
    key = "runs/run1/inp_a/provider-clients/c0.json"
    assert polled.receipts() == {key}
    run = world.home / "runs" / "run1"
    (run / "inp_x").mkdir()
    polled.look()  # reports inp_x, and that the run's entries moved
    os.rename(run / "inp_a", run / "inp_b")  # away before the reader reads
    moved = "runs/run1/inp_b/provider-clients/c0.json"
    assert polled.receipts() == {moved}  # where it is when the reader reads
    os.rename(run / "inp_b", run / "inp_a")  # back, as it was, before the next look
    polled.look()
    assert polled.receipts() == {key}
