"""``session.terminate``'s ``spare``: the caller's own processes are left alone
(docs/design.md §7, §11), through the real daemon on a real socket.

The session's root is a real process with children; sparing it leaves it running
while its children get the signal, and the report says ``spared`` for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
from helpers.daemon import DaemonProcess, raw_replies
from helpers.processes import Processes, proc_state
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.cli.render.terminate import render_terminate
from capsule_client.kit.paths import store_path
from capsule_client.kit.proc import process_start_time
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import SessionProcess
from capsuled.processes.exits import pidfds_supported

pytestmark = pytest.mark.skipif(not pidfds_supported(), reason="no pidfd on this system")

#: A root that starts two children and stays (``exec``: the shell becomes their parent's
#: last program, so the children keep it as their parent).
ROOT = "sleep 300 & sleep 300 & exec sleep 301"


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with Client(daemon.socket_path, timeout_s=30.0) as connected:
        yield connected


def started_root(daemon: DaemonProcess, procs: Processes, session_id: str) -> int:
    root = procs.start(["sh", "-c", ROOT])
    with OwnershipStore(store_path(daemon.home)) as store:
        store.register_session(session_id)
        store.register_process(root.pid, session_id)
    return root.pid


def listed(client: Client, session_id: str) -> list[SessionProcess]:
    for session in client.snapshot(max_age_ms=0).sessions:
        if session.session_id == session_id:
            return list(session.processes)
    return []


def three_listed(client: Client, session_id: str, procs: Processes) -> list[SessionProcess]:
    processes = wait_until(
        lambda: (found := listed(client, session_id)) and len(found) == 3 and found,
        timeout_s=10.0,
        interval_s=0.05,
        message="the root and its two children listed",
    )
    for process in processes:
        procs.adopt(process.pid)
    return processes


def ended(pid: int) -> bool:
    return proc_state(pid) in (None, "Z")


def test_a_spared_root_runs_on_and_its_children_end(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    root = started_root(daemon, procs, "ses_spare")
    processes = three_listed(client, "ses_spare", procs)
    [listed_root] = [p for p in processes if p.pid == root]
    children = sorted(p.pid for p in processes if p.pid != root)

    report = client.terminate(
        "ses_spare", grace_s=5.0, spare=[(listed_root.pid, listed_root.started_at)]
    )

    assert {p.pid: p.outcome for p in report.processes} == {
        root: "spared",
        **dict.fromkeys(children, "exited"),
    }
    assert proc_state(root) == "S"  # never signalled
    assert all(ended(pid) for pid in children)
    assert client.status().totals.terminated_spared == 1


def test_the_start_time_from_the_os_spares_as_the_listed_one_does(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    root = started_root(daemon, procs, "ses_os")
    three_listed(client, "ses_os", procs)

    report = client.terminate("ses_os", spare=[(root, int(process_start_time(root)))])

    assert [p.outcome for p in report.processes if p.pid == root] == ["spared"]
    assert proc_state(root) == "S"


def test_a_spare_whose_start_time_is_another_process_s_spares_nothing(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    """A pid reused since the caller read it is not the process it meant."""
    root = started_root(daemon, procs, "ses_reused")
    [listed_root] = [p for p in three_listed(client, "ses_reused", procs) if p.pid == root]

    report = client.terminate(
        "ses_reused", grace_s=5.0, spare=[(root, listed_root.started_at - 60)]
    )

    assert {p.outcome for p in report.processes} == {"exited"}
    wait_until(lambda: ended(root), message="the root signalled")


def test_a_spare_outside_the_session_changes_nothing(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    root = started_root(daemon, procs, "ses_other")
    three_listed(client, "ses_other", procs)
    stranger = procs.sleep()

    report = client.terminate(
        "ses_other", grace_s=5.0, spare=[(stranger.pid, int(process_start_time(stranger.pid)))]
    )

    assert len(report.processes) == 3 and {p.outcome for p in report.processes} == {"exited"}
    assert stranger.pid not in {p.pid for p in report.processes}
    assert proc_state(stranger.pid) == "S"
    assert ended(root)


@pytest.mark.parametrize(
    ("spare", "why"),
    [
        ([{"pid": 0, "started_at": 1}], "$.spare[0].pid"),
        ([{"pid": 12, "started_at": 1, "start": 2}], "unknown field - at `$.spare[0]`"),
        ([{"pid": 12}], "started_at"),
        ([{"pid": 12, "started_at": 1}] * 1025, "spare"),
        ({"pid": 12, "started_at": 1}, "spare"),
    ],
    ids=["pid-0", "unknown-member", "no-start", "too-many", "not-a-list"],
)
def test_a_spare_that_is_not_a_list_of_processes_is_invalid_params(
    daemon: DaemonProcess, spare: object, why: str
) -> None:
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "session.terminate",
        "params": {"session_id": "ses_none", "spare": spare},
    }

    [reply] = raw_replies(daemon.socket_path, msgspec.json.encode(request) + b"\n")

    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"]["param"] == "spare"
    assert why in reply["error"]["message"]


def test_the_terminate_table_counts_spared_processes(
    daemon: DaemonProcess, client: Client, procs: Processes
) -> None:
    root = started_root(daemon, procs, "ses_table")
    [listed_root] = [p for p in three_listed(client, "ses_table", procs) if p.pid == root]
    report = client.terminate("ses_table", spare=[(root, listed_root.started_at)])

    text = render_terminate(report, wide=True)

    heading = text.splitlines()[0]
    assert "2 exited" in heading and "1 spared" in heading
