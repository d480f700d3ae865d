"""``session.reconcile`` through the real daemon, its clients and ``capsulectl`` (§6-§9).

Sections are those of docs/design.md.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from helpers.daemon import DaemonProcess, raw_exchange
from helpers.waits import ChildOutput, wait_until

from capsule_client import (
    AsyncClient,
    Client,
    InternalError,
    InvalidParams,
    NoSuchTrace,
    ShuttingDown,
    UnsafePath,
)
from capsule_client.cli.main import main as capsulectl
from capsule_client.kit.trace import TraceWriter
from capsule_client.wire import LostReport

WORKS = ["wrk_a", "wrk_b", "wrk_c", "wrk_d"]

DIRECT = r"""
import json, sys
import msgspec
from capsuled.reconcile.prior_session import reconcile
print("ready", flush=True)
sys.stdin.readline()
report = reconcile(sys.argv[1], "ses_prior", sys.argv[2], "ctx_1")
print(json.dumps(None if report is None else msgspec.to_builtins(report)), flush=True)
"""


def write_prior(home: Path, session: str = "ses_prior", *, filler: int = 0) -> Path:
    """A prior session written with the writer kit: four works lost, one completed."""
    writer = TraceWriter(home / "sessions", session)
    writer.session_start()
    writer.task_start("tsk_1", "trusted", context_id="ctx_1")
    for work_id in [*WORKS, "wrk_done"]:
        writer.shell_detached(work_id, "/bin/sh", f"sleep {len(work_id)}", task_id="tsk_1")
    writer.shell_completed("wrk_done", "/bin/sh", "sleep 8", exit_code=0)
    trace = home / "sessions" / session / "trace.jsonl"
    if filler:
        with trace.open("a") as out:
            out.write(
                (json.dumps({"event_type": "model_output", "text": "q" * 900}) + "\n") * filler
            )
    return trace


def hard_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_FSIZE)[1]


def markers(trace: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in trace.read_bytes().splitlines()]
    return [record for record in records if record["event_type"] == "shell_lost"]


def test_reconcile_reports_once_and_a_retry_gets_the_same_report(daemon: DaemonProcess) -> None:
    trace = write_prior(daemon.home)

    with Client(daemon.socket_path) as client:
        report = client.reconcile("ses_prior", "ses_next", "ctx_1")
        after_first = trace.read_bytes()
        retried = client.reconcile("ses_prior", "ses_next", "ctx_1")
        other = client.reconcile("ses_prior", "ses_other", "ctx_1")

    assert report is not None
    assert [work.work_id for work in report.lost] == WORKS
    assert report.provenance.trust == "trusted"
    assert report.context_id == "ctx_1"
    assert report.message.startswith("Lost background work")
    assert retried == report, "the same session asking again gets the same report"
    assert other is None, "another session gets nothing"
    assert trace.read_bytes() == after_first, "neither the retry nor the other wrote"
    assert sorted(marker["work_id"] for marker in markers(trace)) == WORKS


def test_the_async_client_reconciles(daemon: DaemonProcess) -> None:
    write_prior(daemon.home)

    async def go() -> tuple[LostReport | None, LostReport | None]:
        async with AsyncClient(daemon.socket_path) as client:
            first = await client.reconcile("ses_prior", "ses_next", "ctx_1")
            second = await client.reconcile("ses_prior", "ses_third", "ctx_1")
            return first, second

    first, second = anyio.run(go)

    assert first is not None and [work.work_id for work in first.lost] == WORKS
    assert second is None


def test_twenty_reconciles_through_the_daemon_and_ten_processes_report_once(
    daemon: DaemonProcess,
) -> None:
    trace = write_prior(daemon.home, filler=300)
    direct = [
        subprocess.Popen(
            [sys.executable, "-c", DIRECT, str(daemon.home / "sessions"), f"ses_direct{n}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(10)
    ]
    for child in direct:
        assert child.stdout is not None and ChildOutput(child.stdout).line() == b"ready"
    start = threading.Barrier(21)
    through_daemon: list[LostReport | None] = []

    def one(n: int) -> None:
        with Client(daemon.socket_path, timeout_s=30) as client:
            client.ping()  # connected before the start
            start.wait(timeout=10)
            through_daemon.append(client.reconcile("ses_prior", f"ses_rpc{n}", "ctx_1"))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    start.wait(timeout=10)
    for child in direct:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.close()
    for thread in threads:
        thread.join(timeout=30)
    direct_reports = []
    for child in direct:
        assert child.stdout is not None
        with child.stdout:
            direct_reports.append(json.loads(child.stdout.read()))
        assert child.wait(timeout=30) == 0

    reports = [msgspec.to_builtins(r) for r in through_daemon if r is not None]
    reports += [r for r in direct_reports if r is not None]
    assert len(through_daemon) == 20
    assert len(reports) == 1, f"{len(reports)} reports from 30 reconciles"
    (report,) = reports
    assert [work["work_id"] for work in report["lost"]] == WORKS, "each work named once"
    lost = markers(trace)
    assert sorted(marker["work_id"] for marker in lost) == WORKS, "one marker per work"
    assert {marker["reconciled_task_id"] for marker in lost} == {report["task_id"]}


# --------------------------------------------------------------------------
# Errors over the wire


def rpc(daemon: DaemonProcess, params: dict[str, Any]) -> dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": 7, "method": "session.reconcile", "params": params}
    reply: dict[str, Any] = json.loads(
        raw_exchange(daemon.socket_path, json.dumps(request).encode() + b"\n")
    )
    return reply


def params(from_session: str, this_session: str = "ses_next") -> dict[str, str]:
    return {"from_session": from_session, "this_session": this_session, "context_id": "ctx_1"}


def test_an_invalid_session_name_is_invalid_params(daemon: DaemonProcess) -> None:
    trace = write_prior(daemon.home)
    before = trace.read_bytes()

    for name in ["../ses_prior", "ses_prior/..", "not_a_session", "ses_a\\b"]:
        error = rpc(daemon, params(name))["error"]
        assert error["code"] == -32602, name
        assert error["data"]["param"] == "from_session"
    missing = rpc(daemon, {"from_session": "ses_prior", "context_id": "c"})["error"]
    assert missing["code"] == -32602
    with Client(daemon.socket_path) as client, pytest.raises(InvalidParams):
        client.reconcile("", "ses_next", "ctx_1")
    assert trace.read_bytes() == before


def test_a_missing_trace_is_no_such_trace(daemon: DaemonProcess) -> None:
    (daemon.home / "sessions" / "ses_empty").mkdir(parents=True)

    assert rpc(daemon, params("ses_never"))["error"]["code"] == -32003
    assert rpc(daemon, params("ses_empty"))["error"]["code"] == -32003
    with Client(daemon.socket_path) as client, pytest.raises(NoSuchTrace) as raised:
        client.reconcile("ses_never", "ses_next", "ctx_1")
    assert "ses_never" in raised.value.message


def test_a_symlink_below_the_records_root_is_unsafe_path(daemon: DaemonProcess) -> None:
    outside = daemon.home.parent / "outside"
    trace = write_prior(outside)
    before = trace.read_bytes()
    sessions = daemon.home / "sessions"
    sessions.mkdir()
    (sessions / "ses_linkdir").symlink_to(outside / "sessions" / "ses_prior")
    (sessions / "ses_linktrace").mkdir()
    (sessions / "ses_linktrace" / "trace.jsonl").symlink_to(trace)

    for name in ["ses_linkdir", "ses_linktrace"]:
        error = rpc(daemon, params(name))["error"]
        assert error["code"] == -32004, name
        assert "symlink" in error["message"]
    with Client(daemon.socket_path) as client, pytest.raises(UnsafePath):
        client.reconcile("ses_linkdir", "ses_next", "ctx_1")
    assert trace.read_bytes() == before, "nothing written outside the root"


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs prlimit (Linux)")
def test_a_failed_append_is_internal_error_and_reports_nothing(daemon: DaemonProcess) -> None:
    trace = write_prior(daemon.home, filler=1200)  # about 1.1 MB
    before = trace.read_bytes()
    # The daemon may write no file past the trace's size: the markers' append fails (EFBIG).
    soft, hard = resource.prlimit(daemon.pid, resource.RLIMIT_FSIZE, (len(before), hard_limit()))

    error = rpc(daemon, params("ses_prior"))["error"]

    assert error["code"] == -32603
    assert "could not append 4 shell_lost marker(s)" in error["message"]
    assert "File too large" in error["message"], "the cause is named"
    assert trace.read_bytes() == before, "nothing written"
    warnings = [
        json.loads(line) for line in daemon.logs().splitlines() if '"reconcile failed"' in line
    ]
    assert warnings and warnings[0]["level"] == "warning"
    assert "File too large" in warnings[0]["cause"]
    resource.prlimit(daemon.pid, resource.RLIMIT_FSIZE, (soft, hard))
    with Client(daemon.socket_path) as client:
        report = client.reconcile("ses_prior", "ses_next", "ctx_1")
    assert report is not None and [work.work_id for work in report.lost] == WORKS


def test_the_client_raises_internal_error_with_the_daemons_message(
    daemon: DaemonProcess,
) -> None:
    if not hasattr(resource, "prlimit"):
        pytest.skip("needs prlimit (Linux)")
    trace = write_prior(daemon.home, filler=1200)
    resource.prlimit(daemon.pid, resource.RLIMIT_FSIZE, (trace.stat().st_size, hard_limit()))

    with Client(daemon.socket_path) as client, pytest.raises(InternalError) as raised:
        client.reconcile("ses_prior", "ses_next", "ctx_1")

    assert raised.value.code == -32603
    assert "nothing is reported" in raised.value.message
    assert markers(trace) == []


# --------------------------------------------------------------------------
# capsulectl reconcile


def test_capsulectl_reconcile_renders_for_people(daemon: DaemonProcess) -> None:
    write_prior(daemon.home)
    sock = str(daemon.socket_path)
    out = io.StringIO()

    status = capsulectl(
        ["reconcile", "ses_prior", "--as", "ses_next", "--context", "ctx_1", "--socket", sock],
        out=out,
    )

    assert status == 0
    text = out.getvalue()
    assert "Session ses_prior left 4 background commands unaccounted" in text
    assert "trust trusted" in text and "context ctx_1" in text
    for work_id in WORKS:
        assert work_id in text
    assert "sleep 5" in text and "/bin/sh" in text
    again = io.StringIO()
    args = ["reconcile", "ses_prior", "--as", "ses_other", "--context", "ctx_1", "--socket", sock]
    assert capsulectl(args, out=again) == 0
    assert again.getvalue().startswith("Nothing to report")


def test_capsulectl_reconcile_json_prints_the_wire_result(daemon: DaemonProcess) -> None:
    write_prior(daemon.home)
    sock = str(daemon.socket_path)
    base = ["reconcile", "ses_prior", "--context", "ctx_1", "--socket", sock, "--json"]

    first = subprocess.run(
        [sys.executable, "-m", "capsule_client.cli", *base, "--as", "ses_next"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    retried = io.StringIO()
    assert capsulectl([*base, "--as", "ses_next"], out=retried) == 0
    nothing = io.StringIO()
    assert capsulectl([*base, "--as", "ses_other"], out=nothing) == 0

    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert [work["work_id"] for work in report["lost"]] == WORKS
    assert report["provenance"] == {"origin": "completion", "trust": "trusted"}
    assert json.loads(retried.getvalue()) == report
    assert nothing.getvalue() == "null\n"


def test_capsulectl_reconcile_exit_codes(
    daemon: DaemonProcess, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = str(daemon.socket_path)

    assert (
        capsulectl(["reconcile", "ses_gone", "--as", "ses_n", "--context", "c", "--socket", sock])
        == 1
    )
    assert "-32003" in capsys.readouterr().err
    assert (
        capsulectl(["reconcile", "../x", "--as", "ses_n", "--context", "c", "--socket", sock]) == 1
    )
    assert "-32602" in capsys.readouterr().err
    assert capsulectl(["reconcile", "ses_gone", "--context", "c", "--socket", sock]) == 2
    assert capsulectl(["reconcile", "--as", "ses_n", "--context", "c", "--socket", sock]) == 2
    missing = str(short_dir / "none.sock")
    assert (
        capsulectl(["reconcile", "ses_a", "--as", "ses_n", "--context", "c", "--socket", missing])
        == 3
    )
    assert "capsuled is not running" in capsys.readouterr().err
    assert os.path.exists(sock)


def reconcile_with_client(daemon: DaemonProcess) -> list[str]:
    with Client(daemon.socket_path, timeout_s=0.2) as client:
        report = client.reconcile("ses_prior", "ses_next", "ctx_1")
    assert report is not None
    return [work.work_id for work in report.lost]


def reconcile_with_capsulectl_json(daemon: DaemonProcess) -> list[str]:
    out = io.StringIO()
    args = ["reconcile", "ses_prior", "--as", "ses_next", "--context", "ctx_1", "--json"]
    status = capsulectl([*args, "--socket", str(daemon.socket_path), "--timeout", "0.2"], out=out)
    assert status == 0
    return [work["work_id"] for work in json.loads(out.getvalue())["lost"]]


@pytest.mark.parametrize("caller", [reconcile_with_client, reconcile_with_capsulectl_json])
def test_the_client_waits_while_the_daemon_waits_for_the_traces_lock(
    daemon: DaemonProcess, caller: Callable[[DaemonProcess], list[str]]
) -> None:
    trace = write_prior(daemon.home)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            results.append(caller(daemon))
        except BaseException as exc:
            errors.append(exc)

    holder = os.open(trace, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        thread = threading.Thread(target=call)
        started = time.monotonic()
        thread.start()
        # Five times the client's own timeout: it must still be waiting, without error.
        wait_until(lambda: time.monotonic() - started > 1.0 or errors, message="1 s to pass")
        assert errors == [] and thread.is_alive()
        with Client(daemon.socket_path, timeout_s=2) as other:
            assert other.ping().pong, "the waiting reconcile holds a worker thread, not the loop"
    finally:
        os.close(holder)
    thread.join(timeout=15)

    assert errors == []
    assert results == [WORKS]


def test_a_shutdown_gives_up_the_wait_for_the_lock_and_answers_shutting_down(
    daemon: DaemonProcess,
) -> None:
    trace = write_prior(daemon.home)
    before = trace.read_bytes()
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with Client(daemon.socket_path, timeout_s=30) as client:
                client.reconcile("ses_prior", "ses_next", "ctx_1")
        except BaseException as exc:
            errors.append(exc)

    holder = os.open(trace, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        thread = threading.Thread(target=call)
        thread.start()
        wait_until(
            lambda: _has_open(daemon.pid, trace), message="the reconcile to wait for the lock"
        )
        started = time.monotonic()
        assert daemon.stop(signal.SIGTERM) == 0
        stopped_s = time.monotonic() - started
        thread.join(timeout=10)
    finally:
        os.close(holder)
    assert stopped_s < 4, "the drain did not wait out the lock"
    assert [type(e) for e in errors] == [ShuttingDown]
    assert trace.read_bytes() == before, "nothing was written"


def _has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds ``path`` open (it opens the trace, then waits to lock it)."""
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path):
                return True
        except OSError:
            continue
    return False
