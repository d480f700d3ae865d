"""A request is answered by its ``timeout_ms`` even when its observation is stuck.

The rules are docs/design.md §5 and §7.

The stuck observation is real: the ownership store in rollback-journal mode
(as a writer that never asks for WAL leaves it), held with an exclusive lock
by a writer. Every observation reads the store's version first, so it waits
the store's busy timeout (1 s at least, docs/design.md §4) before it answers
``unavailable``: a request with a shorter ``timeout_ms`` must not wait that
long. The observation itself is shared, and goes on.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from helpers.daemon import DaemonProcess
from helpers.waits import wait_until

from capsule_client import Client, DiscoveryUnavailable
from capsule_client.kit.paths import store_path
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import SnapshotParams
from capsuled.discovery.discovery import Discovery
from capsuled.errors import DiscoveryUnavailable as Unavailable
from capsuled.service.supervisor import build_discovery

#: The store's busy timeout: the least time an observation waits for the lock.
BUSY_TIMEOUT_S = 1.0
TIMEOUT_MS = 200
#: Answered by the deadline, with room for a loaded machine; still short of the busy timeout.
ANSWERED_WITHIN_S = 0.8


@pytest.fixture
def home(short_dir: Path) -> Path:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with OwnershipStore(store_path(home)) as store:
        store.register_session("ses_a", context_id="ctx_a")
    return home


@pytest.fixture
def writer(home: Path) -> Iterator[sqlite3.Connection]:
    """A writer's connection to the store, switched to rollback-journal mode."""
    db = sqlite3.connect(store_path(home), isolation_level=None, timeout=5)
    try:
        assert db.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
        yield db
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.close()


def test_max_age_0_is_answered_unavailable_by_its_deadline_while_the_store_is_locked(
    short_dir: Path, home: Path, writer: sqlite3.Connection
) -> None:
    args = ["--sample-interval", "60"]  # only requests observe
    with DaemonProcess(home, short_dir / "d.sock", args) as daemon:
        with Client(daemon.socket_path) as client:
            assert client.snapshot(max_age_ms=0).discovery == "ready"
            observations = client.status().totals.observations
            writer.execute("BEGIN EXCLUSIVE")
            started = time.monotonic()
            with pytest.raises(DiscoveryUnavailable) as raised:
                client.snapshot(max_age_ms=0, timeout_ms=TIMEOUT_MS)
            elapsed_s = time.monotonic() - started
            assert elapsed_s < ANSWERED_WITHIN_S, elapsed_s
            assert f"did not finish within timeout_ms ({TIMEOUT_MS} ms)" in str(raised.value)
            # The observation was not cancelled for it: it ends after the busy timeout.
            # (Another, begun before the lock was taken, may end first and ready:
            # wait for the one that met the lock.)
            status = wait_until(
                lambda: (s := client.status()).discovery == "unavailable" and s,
                message="the stuck observation to end",
            )
            assert status.totals.observations > observations
            assert time.monotonic() - started >= BUSY_TIMEOUT_S
            writer.execute("COMMIT")
            assert client.snapshot(max_age_ms=0).discovery == "ready"


@pytest.fixture
async def discovery(home: Path, writer: sqlite3.Connection) -> AsyncIterator[Discovery]:
    """Discovery of the home in-process, started after the store was switched to rollback mode."""
    discovery = build_discovery(home, sample_interval_s=60, watcher_mode=lambda: "native")
    async with anyio.create_task_group() as tg:
        await tg.start(discovery.serve)
        await discovery.first_observation.wait()
        yield discovery
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_without_max_age_the_deadline_answers_the_latest_observation(
    discovery: Discovery, home: Path, writer: sqlite3.Connection
) -> None:
    latest = discovery.latest
    assert latest is not None and latest.discovery == "ready"
    published = anyio.Event()
    discovery.add_listener(lambda snapshot: published.set())
    writer.execute("BEGIN EXCLUSIVE")
    # A change is pending (as the watcher reports it): the latest answer may not
    # be reused, so the request observes, and that observation waits for the lock.
    discovery.changes.add([home / "runtime/exec-processes/exe_1.json"])
    started = time.monotonic()
    answer = await discovery.snapshot(SnapshotParams(timeout_ms=TIMEOUT_MS))
    elapsed_s = time.monotonic() - started
    assert elapsed_s < ANSWERED_WITHIN_S, elapsed_s
    assert (answer.discovery, answer.generation, answer.observed_at) == (
        "ready",
        latest.generation,
        latest.observed_at,
    )
    # The observation goes on, and is published when the busy timeout lets it fail.
    with anyio.fail_after(5):
        await published.wait()
    assert discovery.latest is not None and discovery.latest.discovery == "unavailable"
    assert time.monotonic() - started >= BUSY_TIMEOUT_S
    writer.execute("COMMIT")


@pytest.mark.anyio
async def test_before_the_first_observation_the_deadline_is_unavailable(
    home: Path, writer: sqlite3.Connection
) -> None:
    """No answer to fall back on yet: -32001 by the deadline, not an answer a second late."""
    writer.execute("BEGIN EXCLUSIVE")  # the first observation waits the busy timeout
    discovery = build_discovery(home, sample_interval_s=60, watcher_mode=lambda: "native")
    async with anyio.create_task_group() as tg:
        await tg.start(discovery.serve)
        assert discovery.latest is None
        started = time.monotonic()
        with pytest.raises(Unavailable) as raised:
            await discovery.snapshot(SnapshotParams(timeout_ms=TIMEOUT_MS))
        elapsed_s = time.monotonic() - started
        assert elapsed_s < ANSWERED_WITHIN_S, elapsed_s
        assert f"did not finish within timeout_ms ({TIMEOUT_MS} ms)" in str(raised.value)
        writer.execute("COMMIT")
        with anyio.fail_after(5):
            await discovery.first_observation.wait()
        tg.cancel_scope.cancel()
