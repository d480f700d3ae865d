"""File names that are not UTF-8 under the home still give an answer that can be sent.

The rules are docs/design.md §3 and §7.

POSIX names are bytes; Python hands the undecodable ones over as lone
surrogates, which no JSON encoder accepts. A gap or a receipt path naming such
a file must still reach the wire, with the odd bytes spelt as ``\\xNN``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import sleepers
from helpers.world import World, pids

from capsule_client import Client


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with sleepers() as pool:
        yield World(tmp_path / "home", pool)


def test_a_broken_receipt_with_a_name_that_is_not_utf8_is_a_gap_that_encodes(
    world: World,
) -> None:
    execs = world.home / "runtime/exec-processes"
    execs.mkdir(parents=True)
    (Path(os.fsdecode(os.fsencode(execs) + b"/bad\xff\xfe.json"))).write_bytes(b"")
    snapshot = world.ready()
    wire = msgspec.json.decode(msgspec.json.encode(snapshot))
    [gap] = [gap for gap in wire["gaps"] if "bad" in gap]
    assert gap.startswith(f"{execs}/bad\\xff\\xfe.json: ")


def test_a_live_receipt_below_a_run_whose_name_is_not_utf8_encodes(world: World) -> None:
    process = world.pool.start()
    world.own("ses_a", inputs=["inp_a"])
    written = world.client_receipt("inp_a", process.pid, run="run1")
    odd_run = Path(os.fsdecode(os.fsencode(world.home / "runs") + b"/run\xff"))
    (world.home / "runs/run1").rename(odd_run)
    world.reader.invalidate()
    snapshot = world.ready()
    assert pids(snapshot) == {"ses_a": [("provider_client", process.pid)]}
    wire = msgspec.json.decode(msgspec.json.encode(snapshot))
    [process_json] = wire["sessions"][0]["processes"]
    assert process_json["receipt"] == "runs/run\\xff/inp_a/provider-clients/" + written.name


def test_the_daemon_answers_snapshots_beside_a_name_that_is_not_utf8(short_dir: Path) -> None:
    home = short_dir / "home"
    execs = home / "runtime/exec-processes"
    execs.mkdir(parents=True, mode=0o700)
    os.chmod(home, 0o700)
    (Path(os.fsdecode(os.fsencode(execs) + b"/\xff.json"))).write_bytes(b"{")
    with DaemonProcess(home, short_dir / "d.sock") as daemon, Client(daemon.socket_path) as c:
        snapshot = c.snapshot(max_age_ms=0)
        assert any(gap.startswith(f"{execs}/\\xff.json: ") for gap in snapshot.gaps)
