"""The watcher feed, with real files and the real inotify watch and poller (docs/design.md §8)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path, PurePath

import anyio
import pytest
from helpers.userns import user_namespaces_work, with_inotify_limit

from capsuled.service.config import ConfigError, parse_args
from capsuled.watch.changes import ChangeFeed
from capsuled.watch.watcher import HomeWatcher, reader_cares

pytestmark = pytest.mark.anyio

DEADLINE_S = 5.0


class Seen:
    """Everything drained from a feed so far."""

    def __init__(self, feed: ChangeFeed) -> None:
        self.feed = feed
        self.paths: set[Path] = set()
        self.rescans = 0
        self.stores = 0

    def take(self) -> None:
        changes = self.feed.drain()
        self.paths |= changes.paths
        self.rescans += changes.rescan
        self.stores += changes.store

    def reset(self) -> None:
        self.take()
        self.paths.clear()
        self.rescans = 0


async def eventually(seen: Seen, predicate: Callable[[], bool], what: str) -> None:
    """Drain the feed until ``predicate`` holds; fail after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        seen.take()
        if predicate():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"not seen within {DEADLINE_S} s: {what} (seen {sorted(seen.paths)})")
        await anyio.sleep(0.005)


@asynccontextmanager
async def running(watcher: HomeWatcher) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.serve)
        yield
        tg.cancel_scope.cancel()


def write_atomically(path: Path, text: str = "{}") -> Path:
    """Write like the writer kit: ``.name.tmp`` then rename. Returns the temp path."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    os.replace(temp, path)
    return temp


def make_home(home: Path) -> Path:
    (home / "runs" / "run_1" / "inp_a" / "provider-clients").mkdir(parents=True)
    (home / "runtime" / "exec-processes").mkdir(parents=True)
    (home / "sessions" / "ses_1").mkdir(parents=True)
    return home


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path / "home")


def watcher_for(home: Path, feed: ChangeFeed, mode: str = "native") -> HomeWatcher:
    # A short poll interval keeps the polling tests fast.
    return HomeWatcher(home, feed, mode=mode, poll_interval_s=0.05)  # type: ignore[arg-type]


MODES = pytest.mark.parametrize("mode", ["native", "polling"])


@pytest.mark.parametrize(
    ("relative", "cares"),
    [
        ("runs", True),
        ("runs/run_1", True),
        ("runs/run_1/inp_a", True),
        ("runs/run_1/inp_a/provider-clients", True),
        ("runs/run_1/inp_a/provider-clients/c.json", True),
        ("runs/run_1/inp_a/provider-clients/c.txt", False),
        ("runs/run_1/inp_a/provider-clients/sub/c.json", False),
        ("runs/run_1/inp_a/manifest.json", False),
        ("runs/run_1/inp_a/output/log.txt", False),
        ("runs/run_1/inp_a/provider-clients/.c.json.tmp", False),
        ("runs/.run_1/inp_a", False),
        ("runtime", True),
        ("runtime/exec-processes", True),
        ("runtime/exec-processes/e.json", True),
        ("runtime/exec-processes/e.json.partial", False),
        ("runtime/exec-processes/sub/e.json", False),
        ("runtime/exec-processes/.e.json.tmp", False),
        ("runtime/opencode-servers.json", True),
        ("runtime/opencode-servers.json/x", False),
        ("runtime/other.json", False),
        ("capsule.db", False),
        ("capsule.db-wal", False),
        ("capsule.db-shm", False),
        ("capsule.db-journal", False),
        ("capsuled.sock", False),
        ("sessions", False),
        ("sessions/ses_1/trace.jsonl", False),
        (".runs", False),
        ("", False),
    ],
)
def test_reader_cares_only_about_receipt_places(relative: str, cares: bool) -> None:
    assert reader_cares(PurePath(relative).parts) is cares


@MODES
async def test_atomic_receipt_write_reaches_the_feed(home: Path, mode: str) -> None:
    feed = ChangeFeed()
    seen = Seen(feed)
    watcher = watcher_for(home, feed, mode)
    async with running(watcher):
        assert watcher.mode == mode
        seen.reset()
        receipt = home / "runs" / "run_1" / "inp_a" / "provider-clients" / "c.json"
        temp = write_atomically(receipt)
        await eventually(seen, lambda: receipt in seen.paths, "the receipt")
        exec_receipt = home / "runtime" / "exec-processes" / "e.json"
        write_atomically(exec_receipt)
        servers = home / "runtime" / "opencode-servers.json"
        write_atomically(servers, "[]")
        await eventually(seen, lambda: {exec_receipt, servers} <= seen.paths, "exec + servers")
    assert temp not in seen.paths
    assert seen.rescans == 0


async def test_receipt_replaced_and_removed_reach_the_feed(home: Path) -> None:
    feed = ChangeFeed()
    seen = Seen(feed)
    receipt = home / "runtime" / "exec-processes" / "e.json"
    receipt.write_text("{}")
    async with running(watcher_for(home, feed)):
        seen.reset()
        write_atomically(receipt, '{"pid": 2}')
        await eventually(seen, lambda: receipt in seen.paths, "the replaced receipt")
        seen.reset()
        receipt.unlink()
        await eventually(seen, lambda: receipt in seen.paths, "the removed receipt")


async def test_a_new_directory_is_fed_even_if_filled_before_it_is_watched(home: Path) -> None:
    # A receipt written right after ``mkdir`` may land before the watch on
    # the new directory exists; the directory itself is fed, so the reader
    # walks it (the original reader's ``reconcile``) and finds the receipt anyway.
    feed = ChangeFeed()
    seen = Seen(feed)
    async with running(watcher_for(home, feed)):
        seen.reset()
        clients = home / "runs" / "run_1" / "inp_b" / "provider-clients"
        clients.mkdir(parents=True)
        receipt = clients / "c.json"
        write_atomically(receipt)
        await eventually(seen, lambda: home / "runs" / "run_1" / "inp_b" in seen.paths, "inp_b")
    assert seen.paths <= {clients.parent, clients, receipt}


@MODES
async def test_hidden_names_and_noise_do_not_reach_the_feed(home: Path, mode: str) -> None:
    feed = ChangeFeed()
    seen = Seen(feed)
    async with running(watcher_for(home, feed, mode)):
        seen.reset()
        # Hidden files and directories, anywhere.
        (home / "runtime" / "exec-processes" / ".e.json").write_text("{}")
        (home / "runs" / ".staging" / "inp_b").mkdir(parents=True)
        (home / ".lock").write_text("")
        # The store, in WAL mode, with its -wal / -shm files, opened and closed.
        db = sqlite3.connect(home / "capsule.db")
        db.execute("PRAGMA journal_mode=wal")
        db.execute("CREATE TABLE sessions(session_id TEXT PRIMARY KEY)")
        for n in range(20):
            db.execute("INSERT INTO sessions VALUES (?)", (f"ses_{n}",))
            db.commit()
        db.close()
        # A trace append, a manifest, a chmod of a receipt directory.
        with (home / "sessions" / "ses_1" / "trace.jsonl").open("a") as trace:
            trace.write('{"event_type": "session_start"}\n')
        (home / "runs" / "run_1" / "inp_a" / "manifest.json").write_text("{}")
        (home / "runtime").chmod(0o750)
        # Then one receipt: once it is seen, everything before it was handled.
        barrier = home / "runtime" / "exec-processes" / "barrier.json"
        write_atomically(barrier)
        await eventually(seen, lambda: barrier in seen.paths, "the barrier receipt")
        if mode == "polling":
            # One more poll round, for changes the walk saw after the barrier.
            later = home / "runtime" / "exec-processes" / "later.json"
            write_atomically(later)
            await eventually(seen, lambda: later in seen.paths, "the second barrier")
            seen.paths.discard(later)
    assert seen.paths == {barrier}
    assert seen.rescans == 0, "SQLite, traces and hidden files must not make the reader rescan"


@MODES
async def test_home_deleted_and_recreated_restarts_the_watch(home: Path, mode: str) -> None:
    feed = ChangeFeed()
    seen = Seen(feed)
    watcher = watcher_for(home, feed, mode)
    async with running(watcher):
        assert watcher.starts == 1
        seen.reset()
        shutil.rmtree(home)
        await eventually(seen, lambda: seen.rescans >= 1, "a rescan after the home was deleted")
        make_home(home)
        await eventually(seen, lambda: watcher.starts == 2, "the watch restarted")
        seen.reset()
        receipt = home / "runtime" / "exec-processes" / "after.json"
        write_atomically(receipt)
        await eventually(seen, lambda: receipt in seen.paths, "a write into the new home")
    assert watcher.mode == mode


async def test_home_renamed_away_and_replaced_is_watched_again(home: Path) -> None:
    feed = ChangeFeed()
    seen = Seen(feed)
    watcher = watcher_for(home, feed)
    async with running(watcher):
        seen.reset()
        os.rename(home, home.with_name("old-home"))
        make_home(home)
        await eventually(seen, lambda: watcher.starts == 2, "the watch restarted")
        assert seen.rescans >= 1
        receipt = home / "runtime" / "exec-processes" / "new.json"
        write_atomically(receipt)
        await eventually(seen, lambda: receipt in seen.paths, "a write into the new home")


@MODES
async def test_home_replaced_by_a_rename_over_it_restarts_the_watch(
    tmp_path: Path, mode: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    feed = ChangeFeed()
    seen = Seen(feed)
    watcher = watcher_for(home, feed, mode)
    async with running(watcher):
        seen.reset()
        # Renamed over the (empty) home: polling reports only the new entries.
        make_home(tmp_path / "new")
        (tmp_path / "new").rename(home)
        await eventually(seen, lambda: watcher.starts == 2, "the watch restarted")
        assert seen.rescans >= 1
        receipt = home / "runtime" / "exec-processes" / "e.json"
        write_atomically(receipt)
        await eventually(seen, lambda: receipt in seen.paths, "a write into the new home")


@MODES
async def test_a_name_that_is_not_utf8_is_fed_and_the_watch_lives_on(home: Path, mode: str) -> None:
    """A run directory and a receipt named in bytes that are not UTF-8: fed like
    any other name (the reader reports them), and later writes are still seen."""
    feed = ChangeFeed()
    seen = Seen(feed)
    watcher = watcher_for(home, feed, mode)
    async with running(watcher):
        seen.reset()
        bad_run = os.fsencode(home / "runs") + b"/run_\xfe"
        os.mkdir(bad_run, 0o700)
        bad = os.fsencode(home / "runtime" / "exec-processes") + b"/e\xff.json"
        os.close(os.open(bad, os.O_WRONLY | os.O_CREAT, 0o600))
        os.listdir(bad_run)  # reads of it are not events
        await eventually(
            seen,
            lambda: {Path(os.fsdecode(bad)), Path(os.fsdecode(bad_run))} <= seen.paths,
            "the names that are not UTF-8",
        )
        receipt = home / "runtime" / "exec-processes" / "after.json"
        write_atomically(receipt)
        await eventually(seen, lambda: receipt in seen.paths, "a write after them")
    assert watcher.starts == 1
    assert watcher.mode == mode
    assert seen.rescans == 0


async def test_missing_home_is_waited_for(tmp_path: Path) -> None:
    feed = ChangeFeed()
    seen = Seen(feed)
    home = tmp_path / "not-yet"
    watcher = watcher_for(home, feed)
    async with running(watcher):
        assert watcher.starts == 0
        make_home(home)
        await eventually(seen, lambda: watcher.starts == 1, "the watch started")
        assert seen.rescans >= 1
        receipt = home / "runs" / "run_1" / "inp_a" / "provider-clients" / "c.json"
        write_atomically(receipt)
        await eventually(seen, lambda: receipt in seen.paths, "the receipt")


async def test_paths_are_fed_under_the_home_as_configured(tmp_path: Path) -> None:
    real = make_home(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    feed = ChangeFeed()
    seen = Seen(feed)
    async with running(watcher_for(link, feed)):
        write_atomically(link / "runtime" / "exec-processes" / "e.json")
        await eventually(seen, lambda: bool(seen.paths), "any path")
    assert seen.paths == {link / "runtime" / "exec-processes" / "e.json"}


async def test_forced_polling_reports_polling(home: Path) -> None:
    feed = ChangeFeed()
    seen = Seen(feed)
    watcher = HomeWatcher(home, feed, mode="polling", poll_interval_s=0.1)
    async with running(watcher):
        assert watcher.mode == "polling"
        receipt = home / "runs" / "run_1" / "inp_a" / "provider-clients" / "c.json"
        write_atomically(receipt)
        await eventually(seen, lambda: receipt in seen.paths, "the receipt")
    assert watcher.mode == "polling"


async def test_off_watches_nothing(home: Path) -> None:
    feed = ChangeFeed()
    seen = Seen(feed)
    watcher = HomeWatcher(home, feed, mode="off")
    async with running(watcher):
        write_atomically(home / "runtime" / "exec-processes" / "e.json")
        await watcher.sync()  # nothing to wait for: returns at once
        seen.take()
        assert watcher.status.backend == "none"
    assert watcher.mode == "off"
    assert watcher.starts == 0
    assert not seen.paths


async def test_no_periodic_rescan(home: Path) -> None:
    """Only a lost watch owes a walk: writes, however many, never do."""
    feed = ChangeFeed()
    seen = Seen(feed)
    async with running(watcher_for(home, feed)):
        seen.reset()
        barrier = home / "runtime" / "exec-processes" / "barrier.json"
        for n in range(5):
            write_atomically(barrier, f'{{"n": {n}}}')
            await eventually(seen, lambda: barrier in seen.paths, "the barrier")
            seen.paths.clear()
    assert seen.rescans == 0


def test_unknown_mode_is_refused(home: Path) -> None:
    with pytest.raises(ValueError, match="native, polling, off"):
        HomeWatcher(home, ChangeFeed(), mode="inotify")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["native", "polling", "off"])
async def test_shutdown_is_fast(home: Path, mode: str) -> None:
    feed = ChangeFeed()
    watcher = watcher_for(home, feed, mode)
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.serve)
        await anyio.sleep(0.05)  # let the watch thread settle into its wait
        cancelled_at = time.monotonic()
        tg.cancel_scope.cancel()
    elapsed_s = time.monotonic() - cancelled_at
    assert elapsed_s < 0.1, f"shutdown took {elapsed_s * 1000:.0f} ms"


async def test_shutdown_while_waiting_for_the_home_is_fast(tmp_path: Path) -> None:
    watcher = watcher_for(tmp_path / "missing", ChangeFeed())
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.serve)
        cancelled_at = time.monotonic()
        tg.cancel_scope.cancel()
    assert time.monotonic() - cancelled_at < 0.1


# The fallback: a native watch that cannot start, for real. Inotify limits are
# per user namespace (/proc/sys/user/max_inotify_*), so a child process in its
# own user namespace can have tiny limits without touching the host's.
FALLBACK_SCRIPT = """
import json, os, sys, time
from pathlib import Path
import anyio
from capsuled.watch.changes import ChangeFeed
from capsuled.watch.watcher import HomeWatcher

async def main(home: Path) -> None:
    feed = ChangeFeed()
    watcher = HomeWatcher(home, feed, poll_interval_s=0.05)
    seen = False
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.serve)
        receipt = home / "runtime" / "exec-processes" / "e.json"
        receipt.write_text("{}")
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            seen = receipt in feed.drain().paths
            await anyio.sleep(0.01)
        status = watcher.status
        tg.cancel_scope.cancel()
    print(json.dumps({"mode": watcher.mode, "seen": seen, "polled": status.polled_directories > 0}))

anyio.run(main, Path(sys.argv[1]))
"""


@pytest.mark.skipif(
    not user_namespaces_work(), reason="needs Linux user namespaces (unshare --user)"
)
@pytest.mark.parametrize(
    ("limit", "value", "outcome", "logged"),
    [
        # The watch limit: the home and runs are watched, the rest is polled.
        (
            "max_inotify_watches",
            2,
            {"mode": "native", "seen": True, "polled": True},
            "cannot watch a directory; polling it instead",
        ),
        # No inotify instance at all: the whole home is polled.
        (
            "max_inotify_instances",
            0,
            {"mode": "polling", "seen": True, "polled": True},
            "falling back to polling",
        ),
    ],
)
def test_a_native_watch_at_its_limits_polls_what_it_cannot_watch(
    home: Path, tmp_path: Path, limit: str, value: int, outcome: dict[str, object], logged: str
) -> None:
    script = tmp_path / "fallback.py"
    script.write_text(FALLBACK_SCRIPT)
    done = subprocess.run(
        with_inotify_limit(limit, value, [sys.executable, str(script), str(home)]),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == outcome
    assert logged in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("argv", "env", "mode"),
    [
        ([], {}, "native"),
        ([], {"CAPSULED_WATCH": "polling"}, "polling"),
        ([], {"CAPSULED_WATCH": "OFF"}, "off"),
        (["--watch", "native"], {"CAPSULED_WATCH": "polling"}, "native"),
        ([], {"CAPSULED_WATCH": ""}, "native"),
    ],
)
def test_watch_mode_from_flag_then_environment(
    argv: list[str], env: dict[str, str], mode: str
) -> None:
    assert parse_args(["--home", "/h", *argv], env).watch == mode


def test_a_bad_watch_mode_is_named() -> None:
    with pytest.raises(ConfigError, match="watch must be one of native, polling, off"):
        parse_args(["--home", "/h", "--watch", "inotify"], {})


# The native watch elsewhere (macOS) is watchfiles; on Linux it can be chosen,
# so its feeding, its barrier and its shutdown are tested here too.


async def test_the_watchfiles_backend_feeds_receipts_and_the_store(home: Path) -> None:
    feed = ChangeFeed()
    seen = Seen(feed)
    watcher = HomeWatcher(home, feed, backend="watchfiles")
    async with running(watcher):
        assert watcher.status.backend == "watchfiles"
        seen.reset()
        receipt = home / "runs" / "run_1" / "inp_a" / "provider-clients" / "c.json"
        write_atomically(receipt)
        (home / "capsule.db").write_bytes(b"")
        (home / "runtime" / "exec-processes" / ".hidden.json").write_text("{}")
        await eventually(seen, lambda: receipt in seen.paths, "the receipt")
        await eventually(seen, lambda: seen.stores > 0, "the store write")
    assert seen.paths == {receipt}


async def test_the_watchfiles_backend_barrier_covers_earlier_writes(home: Path) -> None:
    feed = ChangeFeed()
    watcher = HomeWatcher(home, feed, backend="watchfiles")
    async with running(watcher):
        for n in range(5):
            receipt = home / "runtime" / "exec-processes" / f"e{n}.json"
            write_atomically(receipt)
            with anyio.fail_after(DEADLINE_S):
                await watcher.sync()
            assert receipt in feed.drain().paths
    assert not [n for n in os.listdir(home) if n.startswith(".capsuled-cookie-")]


async def test_the_watchfiles_backend_stops_fast(home: Path) -> None:
    watcher = HomeWatcher(home, ChangeFeed(), backend="watchfiles")
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.serve)
        cancelled_at = time.monotonic()
        tg.cancel_scope.cancel()
    assert time.monotonic() - cancelled_at < 0.5


@MODES
async def test_the_barrier_covers_every_earlier_write(home: Path, mode: str) -> None:
    feed = ChangeFeed()
    watcher = HomeWatcher(home, feed, mode=mode, poll_interval_s=60)  # type: ignore[arg-type]
    async with running(watcher):
        for n in range(20):
            receipt = home / "runs" / "run_1" / "inp_a" / "provider-clients" / f"c{n}.json"
            write_atomically(receipt)
            with anyio.fail_after(DEADLINE_S):
                await watcher.sync()
            assert receipt in feed.drain().paths
    assert not [n for n in os.listdir(home) if n.startswith(".capsuled-cookie-")]
