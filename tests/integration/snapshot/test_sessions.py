"""sessions.snapshot and reader.rescan against the real daemon process.

The rules are docs/design.md §5, §7, §9.
"""

from __future__ import annotations

import io
import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import Sleepers
from helpers.waits import wait_until
from helpers.world import pids

from capsule_client import Client
from capsule_client.cli.main import main as capsulectl
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt, write_provider_client_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot

SAMPLE_INTERVAL_S = 0.5


@pytest.fixture
def sampled_daemon(short_dir: Path) -> Iterator[DaemonProcess]:
    """A real capsuled sampling every 0.5 s, on a fresh home."""
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    args = ["--sample-interval", str(SAMPLE_INTERVAL_S)]
    with DaemonProcess(home, short_dir / "d.sock", args) as process:
        yield process


def own(home: Path, session_id: str, *, inputs: list[str] = [], execs: list[str] = []) -> None:  # noqa: B006
    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id, context_id=f"ctx_{session_id}")
        for input_id in inputs:
            store.register_input(input_id, session_id)
        for exec_id in execs:
            store.register_exec(exec_id, session_id)


def test_a_receipt_written_while_the_daemon_runs_is_seen_without_a_rescan(
    sampled_daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = sampled_daemon.home
    process = pool.start()
    # New directories owe a rescan (docs/design.md §5): make them first.
    (home / "runs/run1/inp_a/provider-clients").mkdir(mode=0o700, parents=True)
    (home / "runtime/exec-processes").mkdir(mode=0o700, parents=True)
    with Client(sampled_daemon.socket_path) as client:
        assert client.status().watcher == "native"
        # Barriers: once a barrier receipt was seen and no rescan happened
        # since the one before it, the directories' events are behind us. (A
        # watch added on a new directory may report what it found there after
        # a later write elsewhere, and the daemon observes as soon as events
        # arrive, so one barrier is not always enough.)
        barriers: list[int] = []

        def quiet_barrier() -> bool:
            before = client.status().totals.rescans
            barriers.append(len(barriers) + 1)
            write_exec_receipt(home, f"exe_barrier{len(barriers)}", process.pid)
            wait_until(
                lambda: len(client.snapshot(max_age_ms=0).unowned) == len(barriers),
                message="the barrier",
            )
            return client.status().totals.rescans == before

        wait_until(quiet_barrier, message="a barrier without a rescan")
        rescans = client.status().totals.rescans
        own(home, "ses_a", inputs=["inp_a"])
        write_provider_client_receipt(home, "run1", "inp_a", "c1", process.pid, provider="demo")
        snapshot = wait_until(
            lambda: (s := client.snapshot(max_age_ms=0)).sessions and s,
            message="the session to appear",
        )
        # No walk saw it: the watcher fed the path. (Which observation read it
        # is not fixed: the daemon observes by itself when the store or a
        # receipt is written, and a retry after "scanning" has nothing dirty.)
        assert snapshot.cost.rescans == 0
        assert pids(snapshot) == {
            "ses_a": [("provider_client", process.pid)],
            "unowned": [("exec", process.pid)] * len(barriers),
        }
        assert snapshot.sessions[0].context_id == "ctx_ses_a"
        assert snapshot.discovery == "ready"
        assert client.status().totals.rescans == rescans  # the watcher fed the one path


def test_without_a_watch_every_observation_walks(short_dir: Path, pool: Sleepers) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    args = ["--sample-interval", str(SAMPLE_INTERVAL_S), "--watch", "off"]
    process = pool.start()
    with DaemonProcess(home, short_dir / "d.sock", args) as daemon, Client(daemon.socket_path) as c:
        assert c.snapshot().unowned == []
        write_exec_receipt(home, "exe_1", process.pid)
        # No watcher told anyone; a walk that began after the request finds it.
        snapshot = c.snapshot(max_age_ms=0)
        assert pids(snapshot) == {"unowned": [("exec", process.pid)]}
        assert snapshot.cost.rescans == 1
        status = c.status()
        assert status.watcher == "off"
        assert "no watcher runs: every observation walks the home from scratch" in status.notes


def test_a_killed_process_leaves_the_snapshot_within_two_samples(
    sampled_daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = sampled_daemon.home
    keep, doomed = pool.start(), pool.start()
    own(home, "ses_a", execs=["exe_keep", "exe_doomed"])
    write_exec_receipt(home, "exe_keep", keep.pid, command="sleep 300")
    write_exec_receipt(home, "exe_doomed", doomed.pid, command="sleep 300")
    with Client(sampled_daemon.socket_path) as client:
        wait_until(
            lambda: len(pids(client.snapshot()).get("ses_a", [])) == 2, message="both processes"
        )
        pool.kill(doomed)
        killed_at = time.monotonic()
        snapshot = wait_until(
            lambda: (s := client.snapshot()) and len(s.sessions[0].processes) == 1 and s,
            message="the killed process to leave",
        )
        elapsed = time.monotonic() - killed_at
    assert pids(snapshot) == {"ses_a": [("exec", keep.pid)]}
    assert elapsed <= 2 * SAMPLE_INTERVAL_S + 0.5, elapsed  # slack for a loaded machine


def test_capsulectl_sessions_and_rescan(sampled_daemon: DaemonProcess, pool: Sleepers) -> None:
    home = sampled_daemon.home
    process = pool.start()
    own(home, "ses_demo", execs=["exe_1"])
    write_exec_receipt(home, "exe_1", process.pid, command="make test")
    socket = ["--socket", str(sampled_daemon.socket_path)]
    with Client(sampled_daemon.socket_path) as client:
        wait_until(lambda: client.snapshot().sessions, message="the session")

    out = io.StringIO()
    assert capsulectl(["sessions", *socket], out=out) == 0
    table = out.getvalue()
    rows = rf"^ses_demo \[ctx_ses_demo\]  running\n  exec +{process.pid} +\d+s +sleep 300$"
    assert re.search(rows, table, re.MULTILINE), table  # the session's line, its process
    assert "unowned:   0 live receipts nobody owns" in table
    assert "discovery: ready" in table

    out = io.StringIO()
    assert capsulectl(["sessions", "--json", *socket], out=out) == 0
    snapshot = msgspec.json.decode(out.getvalue(), type=ActiveSessionsSnapshot)
    assert pids(snapshot) == {"ses_demo": [("exec", process.pid)]}

    with Client(sampled_daemon.socket_path) as client:
        rescans = client.status().totals.rescans
    out = io.StringIO()
    assert capsulectl(["rescan", "--json", *socket], out=out) == 0
    assert json.loads(out.getvalue()) == {"scheduled": True}
    with Client(sampled_daemon.socket_path) as client:
        status = wait_until(
            lambda: (
                (s := client.status()).totals.rescans > rescans and s.discovery == "ready" and s
            ),
            message="a rescan, then a settled answer",
        )
    assert status.last_cost is not None and status.last_cost.process_samples >= 1
    assert status.last_observed_at is not None
    assert status.totals.observations >= 2
    assert status.watcher == "native"


def test_sighup_schedules_a_rescan(sampled_daemon: DaemonProcess) -> None:
    with Client(sampled_daemon.socket_path) as client:
        client.snapshot()
        sampled_daemon.process.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        wait_until(lambda: "rescan requested" in sampled_daemon.logs(), message="the log line")
        assert client.ping().pong


def test_a_replaced_home_restarts_the_reader(sampled_daemon: DaemonProcess, pool: Sleepers) -> None:
    home = sampled_daemon.home
    process = pool.start()
    with Client(sampled_daemon.socket_path) as client:
        client.snapshot(max_age_ms=0)
        home.rename(home.with_name("old-home"))
        home.mkdir(mode=0o700)
        write_exec_receipt(home, "exe_1", process.pid)
        wait_until(lambda: client.status().totals.readers_restarted == 1, message="a restart")
        snapshot = wait_until(
            lambda: (s := client.snapshot(max_age_ms=0)).unowned and s, message="the receipt"
        )
    assert pids(snapshot) == {"unowned": [("exec", process.pid)]}
    assert "home directory was replaced or removed" in sampled_daemon.logs()


def test_since_long_polls_for_a_change(sampled_daemon: DaemonProcess, pool: Sleepers) -> None:
    home = sampled_daemon.home
    process = pool.start()
    with Client(sampled_daemon.socket_path) as client:
        current = client.snapshot()
        started = time.monotonic()
        same = client.snapshot(since=current.generation, timeout_ms=300)
        assert same.generation == current.generation
        assert time.monotonic() - started >= 0.29

    answers: list[ActiveSessionsSnapshot] = []

    def long_poll() -> None:
        with Client(sampled_daemon.socket_path) as poller:
            answers.append(poller.snapshot(since=current.generation, timeout_ms=10_000))

    poll = threading.Thread(target=long_poll)
    poll.start()
    write_exec_receipt(home, "exe_1", process.pid)
    poll.join(timeout=10)
    assert not poll.is_alive()
    assert answers[0].generation > current.generation
    assert pids(answers[0]) == {"unowned": [("exec", process.pid)]}


def test_an_unreadable_store_is_answered_unavailable_and_logged(
    sampled_daemon: DaemonProcess,
) -> None:
    store_path(sampled_daemon.home).write_bytes(b"not a database" * 100)
    with Client(sampled_daemon.socket_path) as client:
        snapshot = client.snapshot(max_age_ms=0)  # an observation begun after the write
        assert snapshot.discovery == "unavailable"
        assert "cannot be read" in snapshot.gaps[0]
        assert client.status().discovery == "unavailable"
    wait_until(
        lambda: "session discovery unavailable" in sampled_daemon.logs(), message="a warning"
    )
    store_path(sampled_daemon.home).unlink()
    with Client(sampled_daemon.socket_path) as client:
        assert client.snapshot(max_age_ms=0).discovery == "ready"  # begun after the unlink
    wait_until(lambda: "session discovery ready again" in sampled_daemon.logs(), message="recovery")
