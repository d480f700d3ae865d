"""`capsulectl run` against a real daemon: the session registered, the environment, reaping,
the report at exit, ``--terminate-on-exit``, ``--wait``, no daemon, and ``spawn``
(docs/design.md §10)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

from helpers.processes import proc_state
from helpers.run import CAPSULECTL, Leftovers, launch, leftovers, run_env, session_processes
from helpers.waits import ChildOutput, wait_until

from capsule_client.kit.launcher import spawn
from capsule_client.kit.paths import store_path

__all__ = ["leftovers"]  # the fixture, imported for the tests below

DEADLINE_S = 10.0


def _finish(launcher: subprocess.Popen[bytes]) -> tuple[int, str]:
    """The launcher's exit status and everything it wrote on stderr."""
    try:
        _, err = launcher.communicate(timeout=DEADLINE_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    return launcher.returncode, err.decode()


def test_a_made_up_session_is_said_registered_and_exported(sock: Path, tmp_path: Path) -> None:
    home = sock.parent / "home"
    seen = tmp_path / "env"
    launcher = subprocess.Popen(
        [*CAPSULECTL, "run", "--title", "a title", "--context", "ctx_1", "--", "sh", "-c",
         f'echo "$CAPSULE_SESSION_ID $CAPSULE_HOME $CAPSULED_SOCKET $PPID" > {seen}; exit 5'],
        env=run_env(home, sock),
        stderr=subprocess.PIPE,
    )  # fmt: skip
    status, err = _finish(launcher)
    assert status == 5
    session_id, seen_home, seen_sock, parent = seen.read_text().split()
    assert err.splitlines()[0] == f"capsulectl run: session {session_id}"
    assert session_id.startswith("ses_") and len(session_id) == 36
    assert (seen_home, seen_sock, int(parent)) == (str(home), str(sock), launcher.pid)
    with sqlite3.connect(store_path(home)) as db:
        assert db.execute(
            "SELECT context_id, title FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchall() == [("ctx_1", "a title")]
        assert db.execute(
            "SELECT pid FROM session_processes WHERE session_id = ?", (session_id,)
        ).fetchall() == [(launcher.pid,)]


def test_adopted_orphans_are_reaped_and_cmd_status_kept(
    sock: Path, leftovers: Leftovers, tmp_path: Path
) -> None:
    home = sock.parent / "home"
    token = leftovers.token()
    go = tmp_path / "go"
    os.mkfifo(go)
    script = f"(sleep {token} &); exec 3<> {go}; read -t 60 _ <&3; exit 9"
    launcher = launch(home, sock, "ses_run_reaped", ["bash", "-c", script])
    (pid,) = leftovers.running(token, timeout_s=DEADLINE_S)
    assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == launcher.pid
    os.kill(pid, signal.SIGKILL)
    # Reaped by the launcher: no zombie left behind (and CMD's own status still to come).
    wait_until(lambda: proc_state(pid) is None, timeout_s=DEADLINE_S, message="the orphan reaped")
    with open(go, "w") as fifo:
        fifo.write("go\n")
    status, err = _finish(launcher)
    assert status == 9
    assert "still has" not in err  # nothing left: no report


def test_terminate_on_exit_stops_the_leftovers_but_not_the_launcher(
    sock: Path, leftovers: Leftovers
) -> None:
    home = sock.parent / "home"
    polite, stubborn = leftovers.token(), leftovers.token()
    # CMD exits once the TERM-ignoring sleep has exec'd (waited for, not slept for).
    script = (
        f"(sleep {polite} &); (trap '' TERM; exec sleep {stubborn}) & "
        'until [ "$(cat /proc/$!/comm)" = sleep ]; do :; done; exit 4'
    )
    launcher = launch(home, sock, "ses_run_term", ["bash", "-c", script], "--terminate-on-exit=0.5")
    status, err = _finish(launcher)
    assert status == 4, err
    assert "terminated session ses_run_term: 2 processes" in err, err
    assert "1 exited" in err and "1 killed" in err, err
    assert leftovers.pids(polite) == leftovers.pids(stubborn) == []


def test_wait_stays_reaping_until_the_leftovers_exit(sock: Path, leftovers: Leftovers) -> None:
    home = sock.parent / "home"
    first, second = leftovers.token(), leftovers.token()
    script = f"(sleep {first} &); (sleep {second} &); exit 6"
    launcher = launch(home, sock, "ses_run_wait", ["bash", "-c", script], "--wait")
    err = ChildOutput(launcher.stderr)
    try:
        err.wait_for(b"waiting for them to exit", timeout_s=DEADLINE_S)
        (one,) = leftovers.running(first, timeout_s=DEADLINE_S)
        (two,) = leftovers.running(second, timeout_s=DEADLINE_S)
        os.kill(one, signal.SIGTERM)
        # The first one reaped, the launcher waits on for the second.
        wait_until(lambda: proc_state(one) is None, timeout_s=DEADLINE_S, message="one reaped")
        assert launcher.poll() is None
        os.kill(two, signal.SIGTERM)
        assert launcher.wait(timeout=DEADLINE_S) == 6
        err.wait_for(b"every process has exited", timeout_s=DEADLINE_S)
        assert proc_state(two) is None  # reaped by the launcher
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        assert launcher.stderr is not None
        launcher.stderr.close()


def test_without_a_daemon_cmd_runs_with_one_warning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    launcher = launch(home, tmp_path / "none.sock", "ses_run_alone", ["sh", "-c", "exit 3"])
    status, err = _finish(launcher)
    assert status == 3
    assert err.splitlines() == [
        f"capsulectl run: capsuled is not running on {tmp_path / 'none.sock'}: the command "
        "runs, but nothing looks at its processes and there is no report at its exit"
    ]


def test_spawn_runs_a_command_under_the_launcher(sock: Path, leftovers: Leftovers) -> None:
    home = sock.parent / "home"
    token = leftovers.token()
    launched = spawn(
        ["sh", "-c", f"(sleep {token} &); exit 2"],
        title="spawned",
        socket=sock,
        env=run_env(home, sock),
        stderr=subprocess.PIPE,
    )
    err = ChildOutput(launched.process.stderr)
    try:
        # The sleep holds stderr open: the report is read up to its last line, not to EOF.
        assert launched.process.wait(timeout=DEADLINE_S) == 2
        err.wait_for(f"capsulectl terminate {launched.session_id}".encode())
    finally:
        assert launched.process.stderr is not None
        launched.process.stderr.close()
    (pid,) = leftovers.running(token, timeout_s=DEADLINE_S)
    process = session_processes(sock, launched.session_id)[pid]
    assert (process.kind, process.root_pid) == ("descendant", launched.process.pid)


def test_a_command_that_cannot_run_is_127_or_126(tmp_path: Path) -> None:
    home, none = tmp_path / "home", tmp_path / "none.sock"
    status, err = _finish(launch(home, none, "ses_run_x", ["/nonexistent/cmd"]))
    assert status == 127 and "/nonexistent/cmd: No such file or directory" in err
    status, err = _finish(launch(home, none, "ses_run_x", [str(tmp_path)]))
    assert status == 126 and "Permission denied" in err


def test_usage_and_help(tmp_path: Path) -> None:
    env = run_env(tmp_path / "home", tmp_path / "none.sock")
    usage = subprocess.run([*CAPSULECTL, "run"], env=env, capture_output=True, text=True)
    assert usage.returncode == 2 and "no command given" in usage.stderr
    bad = subprocess.run(
        [*CAPSULECTL, "run", "--terminate-on-exit=-1", "--", "true"], env=env, capture_output=True
    )
    assert bad.returncode == 2
    helped = subprocess.run(
        [*CAPSULECTL, "run", "--help"], env=env, capture_output=True, text=True, check=True
    )
    for words in ("subreaper", "sudo", "--terminate-on-exit", "--wait", "128 + N"):
        assert words in helped.stdout
