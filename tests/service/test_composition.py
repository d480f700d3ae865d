"""The composition root: the daemon's method table, its one shutdown state, no import cycle."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from capsule_client.kit.paths import records_root
from capsule_client.kit.trace import SessionStart, append_event
from capsule_client.wire import METHOD_PARAMS, NoParams, ReconcileParams, StatusResult
from capsuled.errors import ShuttingDown
from capsuled.handlers.reconcile import Reconciles
from capsuled.service.config import Config
from capsuled.service.lifecycle import Lifecycle
from capsuled.service.supervisor import Supervisor


def test_the_method_table_serves_every_method_of_the_protocol(short_dir: Path) -> None:
    async def build() -> Supervisor:  # the daemon makes anyio primitives: built in a loop
        return Supervisor(Config(home=short_dir / "home", socket=short_dir / "s.sock"))

    daemon = anyio.run(build)

    assert {name: method.params for name, method in daemon.methods.items()} == METHOD_PARAMS


def test_status_reads_the_figures_it_was_given(short_dir: Path) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)

    async def status() -> StatusResult:
        daemon = Supervisor(Config(home=home, socket=short_dir / "s.sock", watch="off"))
        daemon.config = Config(home=home, socket=short_dir / "other.sock", watch="off")
        result = daemon.methods["status"].handler(NoParams())
        assert isinstance(result, StatusResult)
        return result

    result = anyio.run(status)

    assert result.pid == os.getpid()
    assert result.socket == str(short_dir / "other.sock")  # read at the call, not at the build
    assert result.discovery is None and result.last_observed_at is None  # no observation yet
    assert result.clients == result.subscriptions == result.long_polls == 0
    assert result.watcher == "off" and result.verification.interval_s is None


def test_a_shutdown_reaches_a_reconcile_waiting_for_a_locked_trace(tmp_path: Path) -> None:
    root = records_root(tmp_path)
    append_event(root, SessionStart(event_id="evt_1", session_id="ses_a", timestamp=1))
    trace = root / "ses_a" / "trace.jsonl"
    before = trace.read_bytes()
    params = ReconcileParams(from_session="ses_a", this_session="ses_b", context_id="ctx")
    holder = os.open(trace, os.O_RDONLY | os.O_CLOEXEC)  # another process's lock, in effect
    fcntl.flock(holder, fcntl.LOCK_EX)

    async def reconcile_after_shutdown() -> None:
        lifecycle = Lifecycle()
        reconciles = Reconciles(root, cancelled=lifecycle.is_stopping)
        lifecycle.request_shutdown()
        with anyio.fail_after(5):  # not the trace lock's 10 s timeout
            await reconciles.handle(params)

    try:
        with pytest.raises(ShuttingDown):
            anyio.run(reconcile_after_shutdown)
    finally:
        os.close(holder)
    assert trace.read_bytes() == before  # nothing read, nothing written


def test_the_lifecycle_is_one_flag_and_one_wake_up() -> None:
    lifecycle = Lifecycle()
    assert not lifecycle.is_stopping() and lifecycle.exit_status == 0

    async def ask_and_wait() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lifecycle.stopping)
            lifecycle.request_shutdown(exit_status=1)
            lifecycle.request_shutdown()  # a second ask keeps the status
            with anyio.fail_after(5):
                await lifecycle.stopping()

    anyio.run(ask_and_wait)
    assert lifecycle.is_stopping() and lifecycle.exit_status == 1


@pytest.mark.parametrize(
    "module",
    ["capsuled.handlers", "capsuled.handlers.status", "capsuled.handlers.sessions",
     "capsuled.handlers.reconcile", "capsuled.service.lifecycle", "capsuled.rpc.sockets",
     "capsuled.rpc.peers", "capsuled.service.notify", "capsuled.service.home_setup"],
)  # fmt: skip
def test_no_module_the_supervisor_builds_on_imports_the_supervisor(module: str) -> None:
    probe = f"import sys, {module}; print('capsuled.service.supervisor' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"
