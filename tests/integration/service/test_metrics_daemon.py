"""``metrics`` and ``--metrics-textfile`` against the real daemon (docs/design.md §7, §8).

The exposition is read back with prometheus_client's own parsers (OpenMetrics
for the ``metrics`` result, the Prometheus text format for the textfile) and
every family is checked against what ``status`` and ``sessions.snapshot``
say; the textfile is also scraped through Debian's node_exporter.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import pytest
from helpers.daemon import DaemonProcess, raw_exchange
from helpers.processes import Sleepers
from helpers.waits import wait_until
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.samples import Sample

from capsule_client import Client
from capsule_client.cli.main import main as capsulectl
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.kit.trace import TraceWriter
from capsule_client.wire import ActiveSessionsSnapshot, StatusResult

NODE_EXPORTER = "prometheus-node-exporter"

#: Every family the daemon exposes, with its type: a new family needs a check here.
FAMILIES = {
    "capsuled_sessions_active": "gauge",
    "capsuled_sessions": "gauge",
    "capsuled_session_processes": "gauge",
    "capsuled_unowned_receipts": "gauge",
    "capsuled_servers_live": "gauge",
    "capsuled_gaps": "gauge",
    "capsuled_discovery_state": "gauge",
    "capsuled_observations": "counter",
    "capsuled_walks": "counter",
    "capsuled_readers_restarted": "counter",
    "capsuled_verification_runs": "counter",
    "capsuled_verification_changes": "counter",
    "capsuled_reconciles": "counter",
    "capsuled_lost_reports": "counter",
    "capsuled_lost_works": "counter",
    "capsuled_terminated_processes": "counter",
    "capsuled_watch_mode": "gauge",
    "capsuled_watch_watched_directories": "gauge",
    "capsuled_watch_polled_directories": "gauge",
    "capsuled_watch_overflows": "counter",
    "capsuled_requests": "counter",
    "capsuled_request_duration_seconds": "histogram",
    "capsuled_connections": "gauge",
    "capsuled_subscriptions": "gauge",
    "capsuled_subscriptions_dropped": "counter",
    "capsuled_long_polls": "gauge",
    "capsuled_exit_watch_pidfds": "gauge",
    "capsuled_exit_watch_sampled_processes": "gauge",
    "capsuled_resident_memory_bytes": "gauge",
    "capsuled_start_time_seconds": "gauge",
    "capsuled_build_info": "gauge",
}


class Scrape:
    """Samples of one exposition, looked up by name and labels."""

    def __init__(self, families: Iterable[object]) -> None:
        self.types: dict[str, str] = {}
        self.samples: list[Sample] = []
        for family in families:
            self.types[family.name] = family.type  # type: ignore[attr-defined]
            self.samples.extend(family.samples)  # type: ignore[attr-defined]

    def value(self, name: str, **labels: str) -> float:
        found = [s.value for s in self.samples if s.name == name and s.labels == labels]
        assert len(found) == 1, (name, labels, found)
        return float(found[0])

    def by(self, name: str, label: str) -> dict[str, float]:
        return {s.labels[label]: float(s.value) for s in self.samples if s.name == name}

    def capsuled(self) -> dict[str, str]:
        return {name: kind for name, kind in self.types.items() if name.startswith("capsuled_")}


def own_exec(home: Path, session_id: str, exec_id: str, pid: int) -> None:
    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id, context_id=f"ctx_{session_id}")
        store.register_exec(exec_id, session_id)
    write_exec_receipt(home, exec_id, pid, command="sleep")


def write_lost_work(home: Path, session: str, works: int) -> None:
    writer = TraceWriter(home / "sessions", session)
    writer.session_start()
    writer.task_start("tsk_1", "trusted", context_id="ctx_1")
    for n in range(works):
        writer.shell_detached(f"wrk_{n}", "/bin/sh", "sleep 9", task_id="tsk_1")


def check_against_status(
    scrape: Scrape, status: StatusResult, snapshot: ActiveSessionsSnapshot, daemon_pid: int
) -> None:
    """Every family of ``scrape`` against the daemon's own figures."""
    assert scrape.capsuled() == FAMILIES
    assert scrape.value("capsuled_sessions_active") == len(snapshot.sessions)
    kinds = {"provider_client": 0.0, "exec": 0.0, "process": 0.0, "descendant": 0.0}
    for session in snapshot.sessions:
        for process in session.processes:
            kinds[process.kind] += 1
    assert scrape.by("capsuled_session_processes", "kind") == kinds
    assert scrape.value("capsuled_unowned_receipts") == len(snapshot.unowned)
    assert scrape.value("capsuled_servers_live") == len(snapshot.servers)
    assert scrape.value("capsuled_gaps") == len(snapshot.gaps)
    states = scrape.by("capsuled_discovery_state", "state")
    assert states == {s: float(s == status.discovery) for s in ("ready", "scanning", "unavailable")}

    totals = status.totals
    assert scrape.value("capsuled_observations_total") == totals.observations
    assert scrape.value("capsuled_walks_total") == totals.rescans
    assert scrape.value("capsuled_readers_restarted_total") == totals.readers_restarted
    assert scrape.value("capsuled_verification_runs_total") == totals.verifications
    assert scrape.value("capsuled_verification_changes_total") == totals.verification_changes
    assert scrape.value("capsuled_reconciles_total") == totals.reconciles
    assert scrape.by("capsuled_lost_reports_total", "trust") == {
        "trusted": totals.lost_reports_trusted,
        "untrusted": totals.lost_reports_untrusted,
    }
    assert scrape.by("capsuled_lost_works_total", "trust") == {
        "trusted": totals.lost_works_trusted,
        "untrusted": totals.lost_works_untrusted,
    }
    assert scrape.by("capsuled_terminated_processes_total", "outcome") == {
        "exited": totals.terminated_exited,
        "killed": totals.terminated_killed,
        "gone": totals.terminated_gone,
        "refused": totals.terminated_refused,
        "spared": totals.terminated_spared,
    }

    assert status.watch is not None
    modes = scrape.by("capsuled_watch_mode", "mode")
    assert modes == {m: float(m == status.watcher) for m in ("native", "polling", "off")}
    watched = scrape.value("capsuled_watch_watched_directories")
    assert watched == status.watch.watched_directories
    polled = scrape.value("capsuled_watch_polled_directories")
    assert polled == status.watch.polled_directories
    assert scrape.value("capsuled_watch_overflows_total") == status.watch.overflows

    # The metrics request was answered before status, and counted after its own text.
    requests = [s for s in scrape.samples if s.name == "capsuled_requests_total"]
    assert sum(s.value for s in requests) == totals.requests - 1
    assert sum(s.value for s in requests if s.labels["outcome"] != "ok") == totals.errors
    for method in {s.labels["method"] for s in requests}:
        count = scrape.value("capsuled_request_duration_seconds_count", method=method)
        assert count == sum(s.value for s in requests if s.labels["method"] == method)
        assert scrape.value("capsuled_request_duration_seconds_bucket", method=method, le="+Inf")
        assert count == scrape.value(
            "capsuled_request_duration_seconds_bucket", method=method, le="+Inf"
        )

    assert scrape.value("capsuled_connections") == status.clients
    assert scrape.value("capsuled_subscriptions") == status.subscriptions
    dropped = scrape.value("capsuled_subscriptions_dropped_total")
    assert dropped == totals.subscriptions_dropped
    assert scrape.value("capsuled_long_polls") == status.long_polls
    assert scrape.value("capsuled_exit_watch_pidfds") == status.pidfds
    assert scrape.value("capsuled_exit_watch_sampled_processes") == status.sampled
    rss = scrape.value("capsuled_resident_memory_bytes")
    actual = psutil.Process(daemon_pid).memory_info().rss
    assert actual / 2 < rss < actual * 2
    assert scrape.value("capsuled_start_time_seconds") == pytest.approx(status.started_at)
    assert scrape.value("capsuled_build_info", version=status.version) == 1


def test_every_family_of_metrics_matches_the_daemons_own_counters(
    daemon: DaemonProcess, pool: Sleepers
) -> None:
    home = daemon.home
    (home / "runtime/exec-processes").mkdir(mode=0o700, parents=True)
    own_exec(home, "ses_a", "exe_a", pool.start().pid)
    write_exec_receipt(home, "exe_unowned", pool.start().pid)
    write_lost_work(home, "ses_prior", works=3)
    with (
        Client(daemon.socket_path) as client,
        Client(daemon.socket_path) as watcher,
        watcher.subscribe() as changes,
    ):
        assert changes.next(timeout_s=5).full
        client.reconcile("ses_prior", "ses_next", "ctx_1")
        client.reconcile("ses_prior", "ses_next", "ctx_1")  # the same report again
        assert b"-32601" in raw_exchange(
            daemon.socket_path, b'{"jsonrpc":"2.0","id":1,"method":"no.such"}\n'
        )
        wait_until(
            lambda: (
                len(client.snapshot(max_age_ms=0).sessions) == 1
                and len(client.snapshot().unowned) == 1
            ),
            message="the session and the unowned receipt",
        )
        text = client.metrics().text
        status = client.status()
        snapshot = client.snapshot()

    scrape = Scrape(parse_openmetrics(text))
    check_against_status(scrape, status, snapshot, daemon.pid)
    assert status.totals.reconciles == 2
    assert status.totals.lost_works_trusted == 3  # the retry got the same report: counted once
    assert status.totals.lost_reports_trusted == 1
    assert scrape.value("capsuled_requests_total", method="other", outcome="-32601") == 1
    assert scrape.value("capsuled_subscriptions") == 1
    assert scrape.by("capsuled_session_processes", "kind")["exec"] == 1


def test_capsulectl_metrics_prints_the_text_as_it_came(daemon: DaemonProcess) -> None:
    out = io.StringIO()
    assert capsulectl(["--socket", str(daemon.socket_path), "metrics"], out=out) == 0
    printed = out.getvalue()
    assert printed.endswith("# EOF\n")
    scrape = Scrape(parse_openmetrics(printed))
    assert scrape.capsuled() == FAMILIES
    # HELP lines a person can read: a sentence each.
    helps = [line for line in printed.splitlines() if line.startswith("# HELP capsuled_")]
    assert len(helps) == len(FAMILIES)
    assert all(len(line.split(" ", 3)[3]) > 20 for line in helps)


@pytest.fixture
def textfile_daemon(short_dir: Path) -> Iterator[DaemonProcess]:
    """A real capsuled writing its metrics into ``short_dir/textfile/capsuled.prom``."""
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    (short_dir / "textfile").mkdir()
    env = {"CAPSULED_METRICS_TEXTFILE": str(short_dir / "textfile" / "capsuled.prom")}
    with DaemonProcess(home, short_dir / "d.sock", env=env) as process:
        yield process


def textfile_scrape(path: Path) -> Scrape | None:
    try:
        return Scrape(parse_text(path.read_text()))
    except FileNotFoundError:
        return None


def test_the_textfile_holds_every_family_in_the_prometheus_text_format(
    textfile_daemon: DaemonProcess,
) -> None:
    path = textfile_daemon.home.parent / "textfile" / "capsuled.prom"
    scrape = wait_until(lambda: textfile_scrape(path), message="the textfile")
    assert scrape.capsuled() == FAMILIES
    assert scrape.value("capsuled_sessions_active") == 0
    with Client(textfile_daemon.socket_path) as client:
        status = client.status()
    assert scrape.value("capsuled_start_time_seconds") == pytest.approx(status.started_at)
    # Atomic: nothing is left beside it (temp files are renamed over it).
    assert os.listdir(path.parent) == ["capsuled.prom"]


def test_an_unwritable_textfile_is_logged_once_and_the_daemon_serves_on(short_dir: Path) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    target = short_dir / "later" / "capsuled.prom"  # its directory does not exist yet
    args = ["--metrics-textfile", str(target)]
    with DaemonProcess(home, short_dir / "d.sock", args) as daemon:
        wait_until(
            lambda: "cannot write the metrics textfile" in daemon.logs(), message="the warning"
        )
        with Client(daemon.socket_path) as client:
            for _ in range(3):
                assert client.ping().pong  # changes the figures: more writes are due
        target.parent.mkdir()
        wait_until(target.exists, timeout_s=15, message="the textfile written on a retry")
        # The line is logged just after the rename that made the file appear.
        wait_until(
            lambda: "metrics textfile written again" in daemon.logs(), message="the recovery line"
        )
        assert daemon.logs().count("cannot write the metrics textfile") == 1
        with Client(daemon.socket_path) as client:
            assert client.ping().pong


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class NodeExporter:
    """Debian's node_exporter, started with only its textfile collector."""

    def __init__(self, binary: str, directory: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.process = subprocess.Popen(
            [
                binary,
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={directory}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def scrape(self) -> Scrape | None:
        """What ``/metrics`` shows now; None while it does not answer."""
        if self.process.poll() is not None:
            assert self.process.stderr is not None
            raise AssertionError(f"{NODE_EXPORTER} exited: {self.process.stderr.read().decode()}")
        try:
            with urllib.request.urlopen(self.url, timeout=2) as response:
                return Scrape(parse_text(response.read().decode()))
        except OSError:
            return None

    def sessions_active(self) -> float | None:
        scrape = self.scrape()
        if scrape is None or "capsuled_sessions_active" not in scrape.types:
            return None
        return scrape.value("capsuled_sessions_active")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        assert self.process.stderr is not None
        self.process.stderr.close()


@pytest.fixture
def node_exporter(textfile_daemon: DaemonProcess) -> Iterator[NodeExporter]:
    """node_exporter reading the daemon's textfile directory, on a free loopback port."""
    binary = shutil.which(NODE_EXPORTER)
    if binary is None:
        pytest.skip(
            f"{NODE_EXPORTER} is not installed (make test installs it where apt-get runs as root)"
        )
    exporter = NodeExporter(binary, textfile_daemon.home.parent / "textfile")
    try:
        wait_until(exporter.scrape, timeout_s=10, message=f"{NODE_EXPORTER} to answer")
        yield exporter
    finally:
        exporter.close()


@pytest.mark.slow
def test_node_exporter_shows_the_sessions_the_snapshot_shows(
    textfile_daemon: DaemonProcess, node_exporter: NodeExporter, pool: Sleepers
) -> None:
    home = textfile_daemon.home
    (home / "runtime/exec-processes").mkdir(mode=0o700, parents=True)

    def shows(expected: int) -> bool:
        return node_exporter.sessions_active() == expected

    with Client(textfile_daemon.socket_path) as client:
        assert len(client.snapshot(max_age_ms=0).sessions) == 0
        wait_until(lambda: shows(0), timeout_s=15, message="0 sessions through node_exporter")

        sleeper = pool.start()
        own_exec(home, "ses_a", "exe_a", sleeper.pid)
        wait_until(lambda: len(client.snapshot(max_age_ms=0).sessions) == 1, message="session")
        wait_until(lambda: shows(1), timeout_s=15, message="1 session through node_exporter")

        pool.kill(sleeper)
        wait_until(lambda: len(client.snapshot(max_age_ms=0).sessions) == 0, message="its end")
        wait_until(lambda: shows(0), timeout_s=15, message="0 sessions again")
