"""A session's usage totals through the real daemon (docs/design.md §13 "Usage"): its
processes' figures added up, beside them, only with ``usage: true``."""

from __future__ import annotations

import subprocess
import sys

import msgspec
from helpers.daemon import DaemonProcess
from helpers.processes import DEADLINE_S, Processes
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.kit.paths import store_path
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import Session

#: Busy for a while (CPU to measure), holding some memory.
BUSY = (
    "import time\nx = bytearray(8 << 20)\nend = time.time() + 60\nwhile time.time() < end: pass\n"
)


def session_of(client: Client, **asked: bool) -> Session | None:
    for session in client.snapshot(fresh=True, **asked).sessions:
        if session.session_id == "ses_busy":
            return session
    return None


def test_a_sessions_totals_add_up_its_processes(daemon: DaemonProcess, procs: Processes) -> None:
    busy = procs.start([sys.executable, "-c", BUSY], stdout=subprocess.DEVNULL)
    sleep = procs.sleep()
    with OwnershipStore(store_path(daemon.home)) as store:
        store.ensure_session("ses_busy")
        store.register_process(busy.pid, "ses_busy")
        store.register_process(sleep.pid, "ses_busy")
    with Client(daemon.socket_path) as client:
        wait_until(
            lambda: (s := session_of(client)) is not None and len(s.processes) == 2,
            timeout_s=DEADLINE_S,
            message="both listed",
        )
        plain = session_of(client)
        assert plain is not None and isinstance(plain.usage, msgspec.UnsetType)
        session_of(client, usage=True)  # the first measurement of each is 0.0
        measured = wait_until(
            lambda: (
                (s := session_of(client, usage=True)) is not None
                and not isinstance(s.usage, msgspec.UnsetType)
                and s.usage.cpu_percent > 0
                and s
            ),
            timeout_s=DEADLINE_S,
            message="CPU measured",
        )
    usage = measured.usage
    assert not isinstance(usage, msgspec.UnsetType)
    cpus = [p.cpu_percent for p in measured.processes]
    rss = [p.rss_bytes for p in measured.processes]
    assert all(isinstance(c, float) for c in cpus) and all(isinstance(r, int) for r in rss)
    assert usage.processes == 2
    assert usage.rss_bytes == sum(rss)  # type: ignore[arg-type]
    assert abs(usage.cpu_percent - sum(cpus)) <= 0.1 + 1e-9  # type: ignore[arg-type]
