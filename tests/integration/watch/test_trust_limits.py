"""What the watch cannot hear, and its limits: verification, queue overflow, the watch limit.

docs/design.md §5 ("Trusting the watch, and the net under it"): a change
that makes no event where the daemon watches (a receipt rewritten through a
hard link outside its directory, a directory mounted over a receipt
directory) is found by the next verification, logged and counted; a kernel
queue overflow makes the next observation walk at once; a directory past the
watch limit is polled. After each, the answers list exactly the receipts in
the home's real directories (:class:`Trusted` in ``tests/helpers/trust.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers.daemon import DaemonProcess
from helpers.processes import Sleepers
from helpers.trust import (
    MODES,
    REAL_INPUT,
    REAL_RUN,
    WATCH_LATENCY_S,
    Trusted,
    entered_directories,
    pid_of,
    receipt_bytes,
    receipts_of,
    settles,
    trusted,
)
from helpers.userns import user_namespaces_work, with_inotify_limit
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.kit.receipts import (
    process_start_time,
    write_provider_client_receipt,
)
from capsule_client.wire import WatchStatus

#: Slow, and each test writes a machine-wide sysctl (restored in ``finally``).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

VERIFY_INTERVAL_S = 0.5
MISSED = "verification found changes the watch did not report"


def log_events(daemon: DaemonProcess, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in daemon.logs().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def dead_pid(pool: Sleepers) -> int:
    """The pid of a process that has exited and been reaped."""
    process = pool.start()
    pool.kill(process)
    return process.pid


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Truncate and write through this name, no rename: the inode stays the same."""
    with path.open("r+b") as file:
        file.truncate(0)
        file.write(data)


def just_after_a_verification(t: Trusted) -> None:
    """Return just after a verification run ended.

    A change is counted as one the watch missed only if it is older than the
    run's barrier by a margin (docs/design.md §5); made now, it is a whole
    interval older than the next run's.
    """
    runs = t.verification().runs
    wait_until(
        lambda: t.verification().runs > runs,
        timeout_s=VERIFY_INTERVAL_S * 6,
        interval_s=0.005,
        message="a verification run",
    )


# --------------------------------------------------------------------------
# Hard links: a rewrite through a name outside the receipt directory


HARD_LINK_CASES = ("live_to_dead", "live_to_another_live", "broken_to_live", "client_live_to_dead")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", HARD_LINK_CASES)
def test_a_receipt_rewritten_through_a_hard_link_is_found_by_verification(
    short_dir: Path, pool: Sleepers, mode: str, case: str
) -> None:
    args = ["--verify-interval", str(VERIFY_INTERVAL_S)]
    with trusted(short_dir, pool.start(), mode, args) as t:
        if case.startswith("client_"):
            path = t.client_receipt(REAL_RUN, REAL_INPUT, "hard")
        elif case == "broken_to_live":
            path = t.home / "runtime/exec-processes/exe_hard.json"
            path.write_bytes(b'{"schema_version": 1, "exec_id": "exe_hard", "pid": ')
        else:
            path = t.exec_receipt("exe_hard")
        relative = t.relative(path)
        link = t.outside / "hard.json"
        os.link(path, link)
        t.check()
        other = pool.start()
        new_pid = {
            "live_to_dead": dead_pid(pool),
            "client_live_to_dead": dead_pid(pool),
            "live_to_another_live": other.pid,
            "broken_to_live": t.sleeper.pid,
        }[case]
        live = new_pid in (t.sleeper.pid, other.pid)
        new_start = process_start_time(new_pid) if live else time.time()
        just_after_a_verification(t)
        rewrite_in_place(link, receipt_bytes(relative, new_pid, new_start))
        if live:
            t.expected.add(relative)
        else:
            t.expected.discard(relative)
        # No event in the receipt's directory: the next verification finds it.
        answer = settles(
            t.client.snapshot,
            lambda a: t.exact(a) and (not live or pid_of(a, relative) == new_pid),
            timeout_s=VERIFY_INTERVAL_S * 6,
            what="the rewrite to be found",
        )
        assert receipts_of(answer) == sorted(t.expected)
        if mode == "native":
            assert t.verification().changes_found >= 1
            assert t.client.status().totals.verification_changes >= 1
            found = log_events(t.daemon, MISSED)
            assert any(str(path) in entry["paths"] for entry in found), found
            assert all(entry["level"] == "warning" for entry in found)
        t.check()


@pytest.mark.parametrize("mode", MODES)
def test_a_stale_receipt_made_live_through_a_hard_link_is_found_by_a_walk(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    """Polling sees the new signature; a native watch hears nothing, and verification
    checks directories and candidates, never stale receipts (docs/design.md §5): a
    walk from scratch (``reader.rescan``, SIGHUP) finds it."""
    relative = "runtime/exec-processes/exe_stale.json"

    def stale_receipt(t: Trusted) -> None:  # listed by the first walk, as stale
        (t.home / relative).write_bytes(receipt_bytes(relative, dead_pid(pool), time.time()))
        os.link(t.home / relative, t.outside / "stale.json")

    args = ["--verify-interval", str(VERIFY_INTERVAL_S)]
    with trusted(short_dir, pool.start(), mode, args, before_start=stale_receipt) as t:
        t.check()
        live = receipt_bytes(relative, t.sleeper.pid, t.started_at_s)
        rewrite_in_place(t.outside / "stale.json", live)
        t.expected.add(relative)
        if mode == "native":
            t.client.rescan()
        t.plain("the stale receipt made live")
        t.check()


@contextmanager
def bind_mounted(source: Path, target: Path) -> Iterator[None]:
    """``source`` mounted over ``target`` (skips the test where mounting is not allowed)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a bind mount needs root and mount(8)")
    mounted = subprocess.run(
        ["mount", "--bind", str(source), str(target)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mounted.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


EXECS = "runtime/exec-processes"


@contextmanager
def mounted_over_the_exec_directory(t: Trusted) -> Iterator[set[str]]:
    """A directory holding a live receipt mounted over the exec directory, once it is seen.

    Yields:
        the receipts the mount covers (expected again once it is gone).
    """
    t.exec_receipt("exe_under")
    t.check()
    covered = {r for r in t.expected if r.startswith(EXECS + "/")}
    t.exec_receipt("exe_mounted", home=t.outside)
    just_after_a_verification(t)
    with bind_mounted(t.outside / EXECS, t.home / EXECS):
        # No event: the directory at the path is another one now.
        t.expected = (t.expected - covered) | {f"{EXECS}/exe_mounted.json"}
        settles(
            t.client.snapshot,
            t.exact,
            timeout_s=VERIFY_INTERVAL_S * 6,
            what="the mounted directory's receipts",
        )
        yield covered


@pytest.mark.parametrize("mode", MODES)
def test_a_directory_mounted_over_a_receipt_directory_is_found_by_verification(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    args = ["--verify-interval", str(VERIFY_INTERVAL_S)]
    with trusted(short_dir, pool.start(), mode, args) as t:
        with mounted_over_the_exec_directory(t) as covered:
            if mode == "native":
                assert t.verification().changes_found >= 1
                found = [e["paths"] for e in log_events(t.daemon, MISSED)]
                assert any(f"{t.home / EXECS}/exe_mounted.json" in paths for paths in found)
            t.fresh()
            mounted = {r for r in t.expected if r.startswith(EXECS + "/")}
            just_after_a_verification(t)
        # Unmounted: the covered directory, its watch and its receipts are back.
        t.expected = (t.expected - mounted) | covered
        settles(
            t.client.snapshot,
            t.exact,
            timeout_s=VERIFY_INTERVAL_S * 6,
            what="the covered directory's receipts again",
        )
        t.check()


@pytest.mark.parametrize("mode", MODES)
def test_a_directory_mounted_over_a_receipt_directory_is_heard_once_found(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    args = ["--verify-interval", str(VERIFY_INTERVAL_S)]
    with trusted(short_dir, pool.start(), mode, args) as t:
        with mounted_over_the_exec_directory(t):
            # Written into the mounted directory: heard by the watch, not found by verification.
            just_after_a_verification(t)
            later = t.exec_receipt("exe_on_the_mount")
            t.plain("a receipt written into the mounted directory")
            t.fresh()
            just_after_a_verification(t)
            missed = [e for e in log_events(t.daemon, MISSED) if str(later) in e["paths"]]
            assert missed == []


# --------------------------------------------------------------------------
# Kernel queue overflow

QUEUE_SYSCTL = Path("/proc/sys/fs/inotify/max_queued_events")
BURST = 5000
BURST_DEADLINE_S = 1.0
#: Receipts written while the daemon is stopped: far more events than a queue of 64.
OVERFLOWING = 100


@contextmanager
def inotify_queue_of(size: int) -> Iterator[None]:
    """``fs.inotify.max_queued_events`` set to ``size`` (read when an instance is created)."""
    try:
        before = QUEUE_SYSCTL.read_text()
        QUEUE_SYSCTL.write_text(f"{size}\n")
    except OSError as exc:
        pytest.skip(f"needs a writable {QUEUE_SYSCTL} (root): {exc}")
    try:
        yield
    finally:
        QUEUE_SYSCTL.write_text(before)


def write_like_the_kit(path: Path, data: bytes) -> None:
    """A hidden temporary file renamed into place, as the writer kit does, without its fsyncs:
    the events are the same, and a burst outruns the daemon's reads."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    temporary.rename(path)


def test_a_kernel_queue_overflow_loses_no_receipt(short_dir: Path, pool: Sleepers) -> None:
    sleepers = [pool.start() for _ in range(4)]
    starts = {p.pid: process_start_time(p.pid) for p in sleepers}

    def doomed_run(t: Trusted) -> None:
        t.client_receipt("r_doomed", "inp_doomed", "c1")
        # Links the walk owed after an overflow must not follow either.
        t.client_receipt("r1", "inp_a", "c1")
        (t.home / "runs/r1/inp_a/cwd").symlink_to(t.home)
        (t.home / "runs/r2").symlink_to("r1")
        (t.home / "runs/r1/loop").symlink_to("..")

    with ExitStack() as stack:
        with inotify_queue_of(64):
            t = stack.enter_context(
                trusted(short_dir, sleepers[0], "native", before_start=doomed_run)
            )
        # Restored at once: the daemon's inotify instance keeps the queue it was made with.
        t.check()
        assert t.watch().overflows == 0

        def write(n: int) -> str:
            pid = sleepers[n % len(sleepers)].pid
            relative = f"runtime/exec-processes/exe_burst{n}.json"
            write_like_the_kit(t.home / relative, receipt_bytes(relative, pid, starts[pid]))
            if n % 500 == 0:  # directories made and removed while events are lost
                write_provider_client_receipt(
                    t.home, f"r_burst{n}", f"inp_burst{n}", "c1", pid, started_at_s=starts[pid]
                )
            if n == BURST // 2:
                shutil.rmtree(t.home / "runs/r_doomed")
            return relative

        # The first writes land while the daemon is stopped, so the queue overflows
        # whatever the machine's speed; the rest race the daemon's reads.
        with stopped(t.daemon):
            written = {write(n) for n in range(OVERFLOWING)}
        with ThreadPoolExecutor(4) as writers:
            written |= set(writers.map(write, range(OVERFLOWING, BURST)))
        ended = time.monotonic()
        t.forget_under("runs/r_doomed")
        t.expected |= written
        t.expected |= {
            f"runs/r_burst{n}/inp_burst{n}/provider-clients/c1.json" for n in range(0, BURST, 500)
        }
        settles(t.client.snapshot, t.exact, timeout_s=BURST_DEADLINE_S, what="the whole burst")
        assert time.monotonic() - ended <= BURST_DEADLINE_S + 0.1
        assert t.watch().overflows >= 1
        assert log_events(t.daemon, "inotify queue overflowed: events were lost; walking the home")
        t.check()  # also: the walk owed watches the directories made during the burst
        # A receipt in a directory made while events were lost is heard.
        t.client_receipt("r_burst500", "inp_burst500", "after")
        t.plain("a receipt in a directory made during the overflow")


def test_read_your_writes_holds_while_the_queue_overflows(short_dir: Path, pool: Sleepers) -> None:
    sleepers = [pool.start() for _ in range(4)]
    starts = {p.pid: process_start_time(p.pid) for p in sleepers}
    with ExitStack() as stack:
        with inotify_queue_of(64):
            t = stack.enter_context(trusted(short_dir, sleepers[0], "native"))
        done: list[str] = []  # receipts whose write returned, in order
        writing = threading.Event()
        writing.set()
        wrong: list[str] = []
        asked: list[int] = []

        def ask() -> None:
            # Each ready answer with max_age_ms 0 lists every receipt written before it was
            # asked. One may also stay "scanning" to its deadline while writes keep coming
            # (docs/design.md §5 step 4): that says nothing, and lists nothing.
            with Client(t.daemon.socket_path) as client:
                while writing.is_set():
                    before = set(done)
                    answer = client.snapshot(max_age_ms=0)
                    asked.append(len(before))
                    listed = receipts_of(answer)
                    if answer.discovery == "scanning" and not listed:
                        continue
                    missing = before - set(listed)
                    if answer.discovery != "ready" or missing:
                        wrong.append(f"{answer.discovery}, {len(missing)} missing: {answer.gaps}")

        def write(n: int) -> None:
            pid = sleepers[n % len(sleepers)].pid
            relative = f"runtime/exec-processes/exe_burst{n}.json"
            write_like_the_kit(t.home / relative, receipt_bytes(relative, pid, starts[pid]))
            done.append(relative)

        # Written while the daemon is stopped: the queue overflows whatever the
        # machine's speed (a daemon on an idle machine keeps up with the writers).
        with stopped(t.daemon):
            for n in range(OVERFLOWING):
                write(n)
        asker = threading.Thread(target=ask)
        asker.start()
        try:
            with ThreadPoolExecutor(2) as writers:
                list(writers.map(write, range(OVERFLOWING, BURST)))
        finally:
            writing.clear()
            asker.join(timeout=30)
        t.expected |= set(done)
        assert t.watch().overflows >= 1
        assert len(asked) >= 3, asked  # answers asked for during the burst
        assert wrong == []
        t.check()


@contextmanager
def stopped(daemon: DaemonProcess) -> Iterator[None]:
    """The daemon stopped (SIGSTOP) meanwhile: events pile up in the kernel's queue."""
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(daemon.pid, signal.SIGCONT)


def swap(t: Trusted, one: str, two: str) -> None:
    (t.home / one).rename(t.home / "runs/swap")
    (t.home / two).rename(t.home / one)
    (t.home / "runs/swap").rename(t.home / two)
    t.expected = {
        r.replace(one + "/", "\0").replace(two + "/", one + "/").replace("\0", two + "/")
        for r in t.expected
    }


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("moves", ["renamed", "swapped", "moved_to_another_run"])
def test_a_directory_renamed_while_events_were_lost_is_heard_under_its_new_name(
    short_dir: Path, pool: Sleepers, mode: str, moves: str
) -> None:
    def inputs(t: Trusted) -> None:
        t.client_receipt("r1", "inp_a", "c1")
        t.client_receipt("r1", "inp_b", "c1")
        t.client_receipt("r2", "inp_c", "c1")

    with ExitStack() as stack:
        with inotify_queue_of(64) if mode == "native" else ExitStack():
            t = stack.enter_context(trusted(short_dir, pool.start(), mode, before_start=inputs))
        t.check()
        with stopped(t.daemon):
            for n in range(50):  # five events each: far more than the queue holds
                relative = f"runtime/exec-processes/exe_lost{n}.json"
                write_like_the_kit(
                    t.home / relative, receipt_bytes(relative, t.sleeper.pid, t.started_at_s)
                )
                t.expected.add(relative)
            # Made after the queue overflowed: these events are lost.
            if moves == "renamed":
                (t.home / "runs/r1/inp_a").rename(t.home / "runs/r1/inp_z")
                t.expected = {r.replace("runs/r1/inp_a/", "runs/r1/inp_z/") for r in t.expected}
            elif moves == "swapped":
                swap(t, "runs/r1/inp_a", "runs/r1/inp_b")
            else:
                (t.home / "runs/r1/inp_b").rename(t.home / "runs/r2/inp_b")
                t.expected = {r.replace("runs/r1/inp_b/", "runs/r2/inp_b/") for r in t.expected}
        if mode == "native":
            settles(
                t.watch, lambda w: w.overflows >= 1, timeout_s=WATCH_LATENCY_S, what="an overflow"
            )
        t.plain("what happened while the daemon was stopped")
        # Every real provider-clients directory gets a receipt: the moved ones must be heard.
        t.check()


@pytest.mark.parametrize("mode", MODES)
def test_changes_made_while_the_daemon_was_stopped_are_all_heard(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    def runs(t: Trusted) -> None:
        for run, input_id in (("r1", "inp_a"), ("r2", "inp_b"), ("r3", "inp_c")):
            t.client_receipt(run, input_id, "c1")

    with trusted(short_dir, pool.start(), mode, before_start=runs) as t:
        t.check()
        with stopped(t.daemon):  # the queue holds every event: nothing is lost
            (t.home / "runs/r1/inp_a").rename(t.home / "runs/r1/inp_z")
            t.expected = {r.replace("runs/r1/inp_a/", "runs/r1/inp_z/") for r in t.expected}
            t.client_receipt("r1", "inp_z", "while_stopped")
            shutil.rmtree(t.home / "runs/r2")
            t.forget_under("runs/r2")
            (t.home / "runs/r2").symlink_to("r3")
            staged = t.client_receipt("r_staged", "inp_s", "c1", home=t.outside).parents[2]
            (t.home / "runs/r4").mkdir()
            staged.rename(t.home / "runs/r4")  # a run prepared elsewhere, renamed over an empty one
            t.expected.add("runs/r4/inp_s/provider-clients/c1.json")
            exec_receipt = t.exec_receipt("exe_stopped")
            exec_receipt.rename(exec_receipt.with_name("exe_renamed.json"))
            t.expected = (t.expected - {t.relative(exec_receipt)}) | {
                t.relative(exec_receipt.with_name("exe_renamed.json"))
            }
        t.plain("what changed while the daemon was stopped")
        t.check()


# --------------------------------------------------------------------------
# The watch limit


def daemon_with_watches(limit: int) -> type[DaemonProcess]:
    """capsuled in its own user namespace, where only ``limit`` inotify watches are allowed."""

    class DaemonWithFewWatches(DaemonProcess):
        @property
        def command(self) -> list[str]:
            return with_inotify_limit("max_inotify_watches", limit, super().command)

    return DaemonWithFewWatches


#: What the home below enters: the home, runs, runs/r_real, its input and its
#: provider-clients, runtime, runtime/exec-processes, and a spare run's three.
LAYOUT_DIRECTORIES = 10


@pytest.mark.skipif(
    not user_namespaces_work(), reason="needs Linux user namespaces (unshare --user)"
)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("when", ["at_start", "later"])
def test_a_directory_past_the_watch_limit_is_polled_and_heard(
    short_dir: Path, pool: Sleepers, mode: str, when: str
) -> None:
    def spare_run(t: Trusted) -> None:
        t.client_receipt("r_spare", "inp_spare", "c1")
        assert entered_directories(t.home) == LAYOUT_DIRECTORIES

    # At start: two watches short of the layout; later: one more than it needs.
    limit = LAYOUT_DIRECTORIES + (-2 if when == "at_start" else 1)

    def at_the_limit(watch: WatchStatus) -> bool:
        entered = entered_directories(t.home)
        watched = min(limit, entered)
        return (watch.watched_directories, watch.polled_directories) == (watched, entered - watched)

    def check_the_limit(what: str) -> None:
        if mode == "native":  # every directory it cannot watch is polled, retried when it can
            settles(t.watch, at_the_limit, timeout_s=WATCH_LATENCY_S, what=what)

    with trusted(
        short_dir,
        pool.start(),
        mode,
        before_start=spare_run,
        daemon_class=daemon_with_watches(limit),
    ) as t:
        t.limited = True
        t.check()
        check_the_limit("the layout at the limit")
        # A new run, a new input in a watched run, a new provider-clients: past the limit.
        t.client_receipt("r_new", "inp_new", "c1")
        t.client_receipt(REAL_RUN, "inp_more", "c1")
        t.client_receipt("r_spare", "inp_spare2", "c1")
        t.plain("receipts in directories past the watch limit")
        t.fresh()
        check_the_limit("the new directories polled")
        assert mode == "polling" or t.watch().polled_directories > 0
        t.check()
        # A polled directory renamed: polled, and heard, under its new name.
        (t.home / "runs/r_new").rename(t.home / "runs/r_renamed")
        t.expected = {r.replace("runs/r_new/", "runs/r_renamed/") for r in t.expected}
        t.client_receipt("r_renamed", "inp_new", "renamed")
        t.plain("a receipt in a polled directory renamed")
        check_the_limit("the renamed directory polled")
        t.check()
        # Watches freed (a run removed): polled directories are watched in their place.
        shutil.rmtree(t.home / "runs/r_spare")
        t.forget_under("runs/r_spare")
        check_the_limit("polled directories watched again")
        t.check()
        t.client_receipt("r_renamed", "inp_new", "c2")
        t.plain("a receipt in a directory watched again")
    assert mode == "polling" or "cannot watch a directory; polling it instead" in t.daemon.logs()


@pytest.mark.skipif(
    not user_namespaces_work(), reason="needs Linux user namespaces (unshare --user)"
)
@pytest.mark.parametrize("limit", ["max_inotify_watches", "max_inotify_instances"])
def test_a_native_watch_that_cannot_start_falls_back_to_polling_and_says_so(
    short_dir: Path, pool: Sleepers, limit: str
) -> None:
    class DaemonWithoutInotify(DaemonProcess):
        @property
        def command(self) -> list[str]:
            return with_inotify_limit(limit, 0, super().command)

    with trusted(short_dir, pool.start(), "native", daemon_class=DaemonWithoutInotify) as t:
        t.mode = "polling"  # what status must say now
        t.check()
        assert t.client.status().watcher == "polling"
    assert "native watch cannot start; falling back to polling" in t.daemon.logs()
