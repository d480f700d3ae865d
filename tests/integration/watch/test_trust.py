"""Symlinks, cycles, odd files and renames under the home: never deaf, never confidently wrong.

docs/design.md §2 ("Symlinks are never followed") and §8 ("The watch"):
a link anywhere under the home is an entry, never a directory to walk or
watch, and changes nothing about what is seen elsewhere. Every case runs
against the real daemon in both watch modes, most of them with the
adversity made before the daemon starts and made while it runs; after each
one :meth:`Trusted.check` (``tests/helpers/trust.py``) writes receipts for a
live ``sleep`` into the real receipt directories and asserts they are heard
within the watch's latency, are in the next read-your-writes answer, and
that the answer lists exactly the receipts in real directories.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.processes import Sleepers
from helpers.trust import (
    MODES,
    REAL_INPUT,
    REAL_RUN,
    WATCH_LATENCY_S,
    Trusted,
    entered_directories,
    links_under,
    pid_of,
    receipt_bytes,
    receipts_of,
    settles,
    trusted,
    walked_directories,
)
from helpers.waits import wait_until

from capsule_client.wire import ActiveSessionsSnapshot

pytestmark = pytest.mark.timeout(60)

Adversity = Callable[[Trusted], None]
WHEN = ("at_start", "later")


def _mkdir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


# --------------------------------------------------------------------------
# Links: each makes links under the home and the receipts it expects


def cwd_to_the_home(t: Trusted) -> None:
    t.client_receipt("r1", "inp_a", "c1")
    (t.home / "runs/r1/inp_a/cwd").symlink_to(t.home)
    (_mkdir(t.home / "sessions/ses_1") / "cwd").symlink_to(t.home)
    (_mkdir(t.home / "sessions/ses_2/work") / "cwd").symlink_to(t.home / "runs")


def links_to_another_run(t: Trusted) -> None:
    t.client_receipt("r1", "inp_a", "c1")
    (_mkdir(t.home / "runs/r2") / "inp_x").symlink_to("../r1/inp_a")
    (t.home / "runs/r3").symlink_to("r1")


def links_to_receipt_directories(t: Trusted) -> None:
    t.client_receipt("r1", "inp_a", "c1")
    execs = t.home / "runtime/exec-processes"
    (t.home / "runs/r1/inp_a/exec").symlink_to(execs)
    (t.home / "runs/r1/inp_a/exec-processes").symlink_to(execs)
    (t.home / "runs/r1/exec-processes").symlink_to(execs)
    (t.home / "exec-processes").symlink_to(execs)
    clients = t.home / "runs" / REAL_RUN / REAL_INPUT / "provider-clients"
    (_mkdir(t.home / "runs/r1/inp_c") / "provider-clients").symlink_to(clients)


def links_to_directories_outside(t: Trusted) -> None:
    # Live receipts outside the home, reachable through the links: never listed.
    clients = t.client_receipt("r_out", "inp_out", "c1", home=t.outside).parent
    (_mkdir(t.home / "runs/r1/inp_b") / "provider-clients").symlink_to(clients)
    (t.home / "runs/r_out").symlink_to(t.outside / "runs/r_out")
    execs = t.exec_receipt("exe_outside", home=t.outside).parent
    (t.home / "runs/exec-processes").symlink_to(execs)
    (t.home / "runs/r1/inp_b/exec-processes").symlink_to(execs)


def cycles_and_dangling_links(t: Trusted) -> None:
    t.client_receipt("r1", "inp_a", "c1")
    for directory in ("runs", "runs/r1", "runs/r1/inp_a", "runtime", "sessions"):
        (t.home / directory / "a").symlink_to("b")
        (t.home / directory / "b").symlink_to("a")
    (t.home / "runs/r1/inp_a/provider-clients/a.json").symlink_to("b.json")
    (t.home / "runs/r1/inp_a/provider-clients/b.json").symlink_to("a.json")
    (t.home / "runs/r_gone").symlink_to("/nonexistent/run")
    (t.home / "runs/r1/inp_gone").symlink_to("inp_missing")
    (t.home / "runtime/gone").symlink_to(t.root / "never")
    # Links to their own directory or one above it.
    for directory, target in (
        ("", "."),
        ("runs", "."),
        ("runs/r1", ".."),
        ("runs/r1/inp_a", "."),
        ("runs/r1/inp_a/provider-clients", "../.."),
        ("runtime/exec-processes", "."),
    ):
        (t.home / directory / "loop").symlink_to(target)


LINKS: list[Adversity] = [
    cwd_to_the_home,
    links_to_another_run,
    links_to_receipt_directories,
    links_to_directories_outside,
    cycles_and_dangling_links,
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize("adversity", LINKS, ids=lambda a: a.__name__)
def test_a_link_neither_deafens_nor_misleads(
    short_dir: Path, pool: Sleepers, mode: str, when: str, adversity: Adversity
) -> None:
    made_first = adversity if when == "at_start" else None
    with trusted(short_dir, pool.start(), mode, before_start=made_first) as t:
        if when == "later":
            t.check()
            adversity(t)
        t.check()
        # And once the links are gone again.
        for link in links_under(t.home):
            link.unlink()
        t.check()


@pytest.mark.parametrize("mode", MODES)
def test_links_that_come_and_go_within_a_second(short_dir: Path, pool: Sleepers, mode: str) -> None:
    with trusted(short_dir, pool.start(), mode) as t:
        t.client_receipt("r1", "inp_a", "c1")
        t.check()
        for n in range(20):
            made = time.monotonic()
            cycles_and_dangling_links(t)
            (t.home / "runs/r2").symlink_to("r1")
            (t.home / "runs/r1/inp_a/cwd").symlink_to(t.home)
            # A real receipt written while the links flicker is heard all the same.
            t.exec_receipt(f"exe_flicker{n}")
            for link in links_under(t.home):
                link.unlink()
            assert time.monotonic() - made < 1.0  # these links came and went within a second
        t.plain("the receipts written while links flickered")
        t.check()


BIG_TREE = Path("/usr/share")


@pytest.mark.skipif(not BIG_TREE.is_dir(), reason=f"needs a big tree at {BIG_TREE}")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("when", WHEN)
def test_a_link_to_a_big_tree_outside_adds_no_watch_and_no_walk(
    short_dir: Path, pool: Sleepers, mode: str, when: str
) -> None:
    def link_the_big_tree(t: Trusted) -> None:
        t.client_receipt("r1", "inp_a", "c1")
        (t.home / "runs/r1/inp_a/cwd").symlink_to(BIG_TREE)
        (_mkdir(t.home / "sessions/ses_1") / "cwd").symlink_to(BIG_TREE)
        (t.home / "runs/r_share").symlink_to(BIG_TREE)
        (t.home / "runtime/exec-processes/share").symlink_to(BIG_TREE)

    made_first = link_the_big_tree if when == "at_start" else None
    with trusted(short_dir, pool.start(), mode, before_start=made_first) as t:
        if when == "later":
            t.client_receipt("r1", "inp_a", "c1")
            (t.home / "runs/r1/inp_a/cwd").mkdir()  # what the link replaces: counted before
            t.check()
            before = t.check_directories()
            real_before = entered_directories(t.home) - 1  # less the cwd directory
            (t.home / "runs/r1/inp_a/cwd").rmdir()
            link_the_big_tree(t)
        t.check()
        after = t.check_directories()  # exactly the real directories (the helper counts them)
        if when == "later":
            # Grown by the real directories the check made (its new runs), not one more.
            grown = entered_directories(t.home) - real_before
            assert (after.watched_directories, after.polled_directories) == (
                (before.watched_directories - 1 + grown, 0)
                if mode == "native"
                else (0, before.polled_directories - 1 + grown)
            )
        # A walk from scratch lists the real directories only.
        assert t.walk().directories == walked_directories(t.home)
        t.check()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("when", WHEN)
def test_a_linked_receipt_is_a_gap_and_hides_no_real_one(
    short_dir: Path, pool: Sleepers, mode: str, when: str
) -> None:
    execs = "runtime/exec-processes"
    clients = f"runs/{REAL_RUN}/{REAL_INPUT}/provider-clients"
    linked = [f"{execs}/x.json", f"{execs}/alias.json", f"{execs}/dangling.json"]
    linked += [f"{clients}/alias.json", f"{clients}/outside.json"]
    linked.append("runtime/opencode-servers.json")

    def link_receipts(t: Trusted) -> None:
        # A live receipt outside the home; a real one in the home, reached by a second name.
        outside = t.exec_receipt("exe_x", home=t.outside)
        real = t.exec_receipt("exe_real")
        (t.home / execs / "x.json").symlink_to(outside)
        (t.home / execs / "alias.json").symlink_to(real.name)
        (t.home / execs / "dangling.json").symlink_to("nowhere.json")
        t.client_receipt(REAL_RUN, REAL_INPUT, "real")
        (t.home / clients / "alias.json").symlink_to("real.json")
        outside_client = t.client_receipt("r_out", "inp_out", "c1", home=t.outside)
        (t.home / clients / "outside.json").symlink_to(outside_client)
        # The servers registry too: a live server in a registry outside the home.
        registry = t.outside / "opencode-servers.json"
        registry.write_text(json.dumps([{"opencode_pid": t.sleeper.pid}]))
        (t.home / "runtime/opencode-servers.json").symlink_to(registry)

    def gaps_named(answer: ActiveSessionsSnapshot) -> list[str]:
        return sorted(
            path
            for path in linked
            if any(g.startswith(f"{t.home / path}: ") and "symbolic link" in g for g in answer.gaps)
        )

    made_first = link_receipts if when == "at_start" else None
    with trusted(short_dir, pool.start(), mode, before_start=made_first) as t:
        if when == "later":
            t.check()
            link_receipts(t)
        answer = t.check()  # the real receipts, once each, at their real paths
        assert gaps_named(answer) == sorted(linked), answer.gaps
        assert answer.servers == []
        for link in links_under(t.home):
            link.unlink()
        answer = t.check()
        assert gaps_named(answer) == []


# --------------------------------------------------------------------------
# Files that are not receipts where receipts go


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("when", WHEN)
def test_fifos_sockets_devices_and_directories_named_json_never_hold_it_up(
    short_dir: Path, pool: Sleepers, mode: str, when: str
) -> None:
    sockets: list[socket.socket] = []
    fifo_writers: list[int] = []
    execs = "runtime/exec-processes"
    clients = f"runs/{REAL_RUN}/{REAL_INPUT}/provider-clients"
    odd = [f"{d}/{name}" for d in (execs, clients) for name in ("fifo.json", "dir.json", "s.json")]
    odd.append("runtime/opencode-servers.json")
    if os.geteuid() == 0:
        odd.append(f"{execs}/null.json")

    def make_odd_files(t: Trusted) -> None:
        for directory in (execs, clients):
            os.mkfifo(t.home / directory / "fifo.json", 0o600)
            (t.home / directory / "dir.json").mkdir()
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sockets.append(listener)
            listener.bind(str(t.home / directory / "s.json"))
            listener.listen()
        os.mkfifo(t.home / "runtime/opencode-servers.json", 0o600)
        if os.geteuid() == 0:  # a character device, as /dev/null
            os.mknod(t.home / execs / "null.json", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        # A writer holding a FIFO open: a blocking read would wait for it forever.
        fifo_writers.append(os.open(t.home / execs / "fifo.json", os.O_RDWR | os.O_NONBLOCK))

    made_first = make_odd_files if when == "at_start" else None
    try:
        with trusted(short_dir, pool.start(), mode, before_start=made_first) as t:
            if when == "later":
                t.check()
                make_odd_files(t)
            began = time.monotonic()
            answer = t.check()
            assert time.monotonic() - began < 2 * WATCH_LATENCY_S + 1  # never hung on a FIFO
            named = sorted(
                p for p in odd if any(g.startswith(f"{t.home / p}:") for g in answer.gaps)
            )
            assert named == sorted(odd), answer.gaps
    finally:
        for listener in sockets:
            listener.close()
        for fd in fifo_writers:
            os.close(fd)


@pytest.mark.parametrize("mode", MODES)
def test_a_fifo_where_the_store_goes_is_unavailable_at_once_then_ready_again(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    with trusted(short_dir, pool.start(), mode) as t:
        t.check()
        store = t.home / "capsule.db"
        for name in ("capsule.db", "capsule.db-wal", "capsule.db-shm"):
            (t.home / name).unlink(missing_ok=True)
        os.mkfifo(store, 0o600)
        writer = os.open(store, os.O_RDWR | os.O_NONBLOCK)  # a blocking read would wait forever
        try:
            began = time.monotonic()
            answer = t.client.snapshot(max_age_ms=0)  # the next answer, at once
            assert time.monotonic() - began < WATCH_LATENCY_S
            assert answer.discovery == "unavailable", answer
            assert "not a regular file" in answer.gaps[0], answer.gaps
            assert answer.sessions == [] and answer.unowned == []
        finally:
            os.close(writer)
        store.unlink()
        t.input_owners.clear()  # a new store: nobody owns anything until the check registers
        t.exec_owners.clear()
        t.check()


@pytest.mark.parametrize("mode", MODES)
def test_a_receipt_written_in_place_in_two_parts_shows_its_final_content(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    with trusted(short_dir, pool.start(), mode) as t:
        t.check()
        relative = "runtime/exec-processes/exe_half.json"
        body = receipt_bytes(relative, t.sleeper.pid, t.started_at_s)
        fd = os.open(t.home / relative, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, body[: len(body) // 2])
            # The pause: until the daemon has read the half (it is a gap, not a receipt).
            half = settles(
                lambda: t.client.snapshot(max_age_ms=0),
                lambda a: any(g.startswith(f"{t.home / relative}: invalid") for g in a.gaps),
                timeout_s=WATCH_LATENCY_S,
                what="the half-written receipt to be a gap",
            )
            assert receipts_of(half) == sorted(t.expected)
            os.write(fd, body[len(body) // 2 :])
            t.expected.add(relative)
            # Still open: the write itself is heard, not only the close.
            answer = t.plain("the completed receipt")
            assert not any(g.startswith(f"{t.home / relative}:") for g in answer.gaps)
            t.fresh()
        finally:
            os.close(fd)
        t.check()


@pytest.mark.parametrize("mode", MODES)
def test_a_receipt_rewritten_in_place_shows_its_new_process(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    with trusted(short_dir, pool.start(), mode) as t:
        other = pool.start()
        path = t.exec_receipt("exe_moving")
        relative = t.relative(path)
        t.check()
        assert pid_of(t.fresh(), relative) == t.sleeper.pid
        # Truncated and rewritten through the same descriptor, no rename.
        with path.open("r+b") as file:
            file.truncate(0)
            file.flush()
            file.write(receipt_bytes(relative, other.pid, time.time()))
        answer = settles(
            t.client.snapshot,
            lambda a: pid_of(a, relative) == other.pid,
            timeout_s=WATCH_LATENCY_S,
            what="the rewritten receipt's new pid",
        )
        assert t.exact(answer)
        assert pid_of(t.fresh(), relative) == other.pid
        t.check()


@pytest.mark.parametrize("mode", MODES)
def test_a_receipt_renamed_away_hidden_and_back_is_listed_only_where_it_is(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    with trusted(short_dir, pool.start(), mode) as t:
        path = t.client_receipt(REAL_RUN, REAL_INPUT, "wanderer")
        relative = t.relative(path)
        t.check()
        for away in (t.outside / "wanderer.json", path.with_name(".wanderer.json")):
            path.rename(away)  # out of the home, then to a hidden name
            t.expected.discard(relative)
            t.plain(f"the receipt gone to {away}")
            away.rename(path)
            t.expected.add(relative)
            t.plain("the receipt back")
        # Moved to another input's directory: listed there, for that input, once.
        moved = t.home / "runs/r1/inp_b/provider-clients/wanderer.json"
        moved.parent.mkdir(parents=True)
        path.rename(moved)
        t.expected = (t.expected - {relative}) | {t.relative(moved)}
        t.check()


# --------------------------------------------------------------------------
# Directories renamed, moved out of the home and back


def rename_expected(t: Trusted, old: str, new: str) -> None:
    t.expected = {new + r[len(old) :] if r.startswith(old + "/") else r for r in t.expected}


@pytest.mark.parametrize("mode", MODES)
def test_an_input_renamed_within_the_home_is_heard_under_its_new_name(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    with trusted(short_dir, pool.start(), mode) as t:
        t.client_receipt("r1", "inp_a", "c1")
        t.client_receipt("r1", "inp_b", "c1")
        t.check()
        runs = t.home / "runs"
        # Renamed to another input id, then to another run.
        (runs / "r1/inp_a").rename(runs / "r1/inp_c")
        rename_expected(t, "runs/r1/inp_a", "runs/r1/inp_c")
        t.check()
        (runs / "r1/inp_c").rename(runs / REAL_RUN / "inp_c")
        rename_expected(t, "runs/r1/inp_c", f"runs/{REAL_RUN}/inp_c")
        t.check()
        # Two inputs swapped through a third name: each keeps its own receipts.
        one, two = "runs/r1/inp_b", f"runs/{REAL_RUN}/inp_c"
        (t.home / one).rename(t.home / "runs/r1/inp_swap")
        (t.home / two).rename(t.home / one)
        (t.home / "runs/r1/inp_swap").rename(t.home / two)
        rename_expected(t, one, "swap")
        rename_expected(t, two, one)
        rename_expected(t, "swap", two)
        t.check()
        # Writes into the renamed directories are heard at their new paths.
        t.client_receipt("r1", "inp_b", "after")
        t.client_receipt(REAL_RUN, "inp_c", "after")
        t.plain("receipts written into renamed directories")
        # A whole run renamed.
        (runs / "r1").rename(runs / "r9")
        rename_expected(t, "runs/r1", "runs/r9")
        t.check()
        t.client_receipt("r9", "inp_b", "after9")
        t.check()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "moved",
    [
        "runs/r1/inp_a",
        "runs/r1",
        "runs/r1/inp_a/provider-clients",
        "runtime/exec-processes",
        "runtime",
    ],
)
def test_a_directory_moved_out_of_the_home_and_back(
    short_dir: Path, pool: Sleepers, mode: str, moved: str
) -> None:
    with trusted(short_dir, pool.start(), mode) as t:
        t.client_receipt("r1", "inp_a", "c1")
        t.exec_receipt("exe_mover")
        t.check()
        away = t.outside / moved
        away.parent.mkdir(parents=True, exist_ok=True)
        (t.home / moved).rename(away)
        kept = {r for r in t.expected if r.startswith(moved + "/")}
        t.forget_under(moved)
        t.check()  # without exec-processes, only provider-client receipts probe it
        # A receipt written into the moved-away directory is not listed under its old path.
        if moved.startswith("runs/"):
            written = t.client_receipt("r1", "inp_a", "while_away", home=t.outside)
        else:
            written = t.exec_receipt("exe_while_away", home=t.outside)
        kept.add(str(written.relative_to(t.outside)))
        t.check()
        # Moved back: its receipts, the one written while away too, are listed again.
        away.rename(t.home / moved)
        t.expected |= kept
        t.check()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "replaced", ["runs", "runs/r1", "runs/r1/inp_a/provider-clients", "runtime/exec-processes"]
)
def test_a_directory_removed_and_made_again_at_once_is_watched_anew(
    short_dir: Path, pool: Sleepers, mode: str, replaced: str
) -> None:
    with trusted(short_dir, pool.start(), mode) as t:
        t.client_receipt("r1", "inp_a", "c1")
        t.exec_receipt("exe_replaced")
        t.check()
        for n in range(10):  # faster than a poll interval: some are never seen at all
            shutil.rmtree(t.home / replaced)
            t.forget_under(replaced)
            t.client_receipt("r1", "inp_a", f"c{n}")
            t.exec_receipt(f"exe_replaced{n}")
        t.plain("the receipts in the directory made last")
        t.check()
        # Its new inode is the one watched: later writes into it are heard.
        t.client_receipt("r1", "inp_a", "later")
        t.exec_receipt("exe_later")
        t.plain("a receipt in the directory made again")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("one", "two"), [("runs/r1", "runs/r2"), ("runs/r1/inp_a", "runs/r1/inp_b")]
)
def test_a_directory_renamed_over_an_empty_one_is_heard_in_its_place(
    short_dir: Path, pool: Sleepers, mode: str, one: str, two: str
) -> None:
    """``rename(2)`` onto an empty directory replaces it: the replaced directory's own
    events (its removal) come after the move's, and must not take the moved one's
    watch, or the watches below it, with them. Polled, the directory moves away and
    back between two looks now and then, while the reader reads in between: what
    the reader found gone must be read again when it is back."""

    def write_into(t: Trusted, directory: str, client: str) -> None:
        """A receipt in the run (its input ``inp_b``) or the input ``directory``."""
        _, run, *input_id = Path(directory).parts
        t.client_receipt(run, input_id[0] if input_id else "inp_b", client)

    with trusted(short_dir, pool.start(), mode) as t:
        write_into(t, two, "c0")
        t.check()
        source, target = two, one
        for n in range(10):  # back and forth: each time over an empty directory
            (t.home / target).mkdir(mode=0o700)
            t.check_directories()  # the empty one is watched (or polled) too
            os.rename(t.home / source, t.home / target)
            rename_expected(t, source, target)
            write_into(t, target, f"after{n}")
            t.plain(f"a receipt written into the directory renamed over {target} ({n})")
            source, target = target, source
        t.check()


# --------------------------------------------------------------------------
# A receipt directory that is itself a link, then real again


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize("linked", ["runs", "runtime", "runtime/exec-processes"])
def test_a_receipt_directory_that_is_a_link_is_read_once_it_is_real(
    short_dir: Path, pool: Sleepers, mode: str, when: str, linked: str
) -> None:
    def servers(answer: ActiveSessionsSnapshot) -> list[int]:
        return [server.pid for server in answer.servers]

    def link_it(t: Trusted) -> None:
        # The real directory goes outside with its receipts, and a link takes its place.
        t.client_receipt(REAL_RUN, REAL_INPUT, "before")
        t.exec_receipt("exe_before")
        registry = t.home / "runtime/opencode-servers.json"
        registry.write_text(json.dumps([{"opencode_pid": t.sleeper.pid}]))
        target = t.outside / "moved" / linked
        target.parent.mkdir(parents=True, exist_ok=True)
        (t.home / linked).rename(target)
        (t.home / linked).symlink_to(target)
        t.forget_under(linked)

    made_first = link_it if when == "at_start" else None
    with trusted(short_dir, pool.start(), mode, before_start=made_first) as t:
        if when == "later":
            t.check()
            link_it(t)
        answer = t.check()  # it probes where the directories are real
        assert servers(answer) == ([] if linked == "runtime" else [t.sleeper.pid])
        # The link replaced by the real directory it pointed to: what is in it is read.
        target = (t.home / linked).readlink()
        (t.home / linked).unlink()
        target.rename(t.home / linked)
        t.expected |= {
            str(path.relative_to(t.home))
            for path in (t.home / linked).rglob("*.json")
            if path.is_file() and path.name != "opencode-servers.json"
        }
        assert servers(t.check()) == [t.sleeper.pid]


# --------------------------------------------------------------------------
# An idle daemon sleeps (docs/design.md §8)

IDLE_WINDOW_S = 2.0


def read_everything(root: Path, stop: threading.Event) -> int:
    """What a backup or a ``grep -r`` does to the home: list, stat and read every file."""
    reads = 0
    while not stop.is_set():
        for directory, _, files in os.walk(root):
            for name in files:
                path = os.path.join(directory, name)
                if stat.S_ISREG(os.lstat(path).st_mode):
                    with open(path, "rb") as file:
                        file.read()
                    reads += 1
    return reads


@pytest.mark.parametrize("mode", MODES)
def test_an_idle_daemon_observes_nothing_while_another_program_reads_the_home(
    short_dir: Path, pool: Sleepers, mode: str
) -> None:
    with trusted(short_dir, pool.start(), mode) as t:
        cwd_to_the_home(t)
        cycles_and_dangling_links(t)
        # Gaps that stay: a broken receipt, a FIFO, a linked receipt.
        execs = t.home / "runtime/exec-processes"
        (execs / "broken.json").write_bytes(b'{"schema_version": 1, "pid": ')
        os.mkfifo(execs / "fifo.json", 0o600)
        (execs / "linked.json").symlink_to(t.exec_receipt("exe_elsewhere", home=t.outside))
        assert len(t.check().gaps) >= 3
        counts: list[int] = []

        def settled() -> bool:
            counts.append(t.client.status().totals.observations)
            return len(counts) >= 2 and counts[-1] == counts[-2]

        # What the check's writes caused is over once two looks 0.25 s apart agree.
        wait_until(settled, timeout_s=5, interval_s=0.25, message="the observations to settle")
        before = t.client.status()
        stop = threading.Event()
        reads: list[int] = []
        reader = threading.Thread(target=lambda: reads.append(read_everything(t.home, stop)))
        reader.start()
        try:
            time.sleep(IDLE_WINDOW_S)  # a negative claim: nothing happens over a window
        finally:
            stop.set()
            reader.join(timeout=10)
        after = t.client.status()
        assert reads and reads[0] > 0
        assert after.totals.observations == before.totals.observations
        assert after.totals.rescans == before.totals.rescans
        assert after.watch == before.watch
        t.check()  # and it still hears
