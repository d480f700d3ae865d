"""Nothing escapes `capsulectl run`: a catalogue of the ways a command leaves a process behind
(docs/design.md §10).

Each pattern runs as CMD under the real launcher against a real daemon. What it
leaves (``sleep TOKEN``, found by its exact argv) must be listed in the session as
a ``descendant`` with ``root_pid`` the launcher while CMD runs, in the report at
CMD's exit, and after the launcher has exited.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers.run import Leftovers, launch, leftovers, session_processes
from helpers.waits import ChildOutput, wait_until

from capsule_client import Client

__all__ = ["leftovers"]  # the fixture, imported for the tests below

DEADLINE_S = 10.0

#: A daemon(3) from Python: fork, setsid, fork again, chdir /, stdio to /dev/null, exec.
DAEMON3 = textwrap.dedent(
    """\
    import os, sys
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execvp("sleep", ["sleep", sys.argv[1]])
        os._exit(0)
    os.wait()
    """
)

#: Closes every descriptor (the launcher's pipe to it included), then double-forks.
CLOSES_ALL = textwrap.dedent(
    """\
    import os, sys
    os.closerange(0, 65536)
    if os.fork() == 0:
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", sys.argv[1]])
        os._exit(0)
    os.wait()
    """
)


class Pattern(NamedTuple):
    script: str  # bash; {t} is the sleep's token, {py} this Python
    count: int = 1  # sleeps it leaves
    last_moment: bool = False  # made after CMD was released, just before it exits


PATTERNS = {
    "subshell": Pattern("(sleep {t} &)"),
    "nohup": Pattern("nohup sleep {t} >/dev/null 2>&1 &"),
    "setsid": Pattern("setsid sleep {t} &"),
    "setsid-double-fork": Pattern("setsid -f sh -c 'sleep {t} & exit 0'"),
    "daemon3-python": Pattern("{py} -c '" + DAEMON3 + "' {t}"),
    "disown": Pattern("sleep {t} & disown"),
    "job-control": Pattern("set -m; sleep {t} &"),
    "last-moment": Pattern("(sleep {t} &)", last_moment=True),
    "last-moment-setsid": Pattern("setsid -f sleep {t}", last_moment=True),
    "nohup-then-exit": Pattern("nohup sleep {t} >/dev/null 2>&1 &", last_moment=True),
    "setsid-then-exit": Pattern("setsid sleep {t} &", last_moment=True),
    "closes-all-fds": Pattern("{py} -c '" + CLOSES_ALL + "' {t}"),
    "grandchild-forks-50": Pattern(
        "(sh -c 'for i in $(seq 50); do (sleep {t} &); done' &)", count=50
    ),
    "re-execs-itself": Pattern("(exec sh -c 'exec sh -c \"exec sleep {t}\"' &)"),
    "parent-killed": Pattern("(sh -c 'sleep {t} & kill -9 $$' &)"),
    "nested-sessions": Pattern("setsid -f sh -c 'setsid -f sh -c \"(sleep {t} &)\"'"),
}


def _release(go: Path) -> None:
    """Write the line CMD waits for on ``go``, if CMD still reads it."""
    try:
        fd = os.open(go, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody reads it any more
        return
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)


def _listed_under(sock: Path, session_id: str, pids: list[int], root: int) -> bool:
    processes = session_processes(sock, session_id)
    return all(
        pid in processes and processes[pid].kind == "descendant" and processes[pid].root_pid == root
        for pid in pids
    )


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_nothing_escapes(sock: Path, leftovers: Leftovers, tmp_path: Path, name: str) -> None:
    pattern = PATTERNS[name]
    home = sock.parent / "home"
    session_id = f"ses_run_{name}"
    token = leftovers.token()
    go = tmp_path / "go"
    os.mkfifo(go)
    ready = tmp_path / "ready"
    leave = pattern.script.format(t=token, py=sys.executable)
    before, after = ("", leave) if pattern.last_moment else (leave, "")
    # The FIFO opened read-write (no block), the read bounded: a CMD whose test failed
    # exits by itself.
    script = f"{before}\nexec 3<> {go}\necho ok > {ready}\nread -t 60 _ <&3\n{after}\nexit 0\n"
    launcher = launch(home, sock, session_id, ["bash", "-c", script])
    err = ChildOutput(launcher.stderr)
    try:
        wait_until(ready.exists, timeout_s=DEADLINE_S, message="CMD started its pattern")
        if not pattern.last_moment:
            pids = leftovers.running(token, pattern.count, timeout_s=DEADLINE_S)
            # While CMD runs.
            assert _listed_under(sock, session_id, pids, launcher.pid), (
                pids,
                session_processes(sock, session_id),
            )
        with open(go, "w") as fifo:
            fifo.write("go\n")
        assert launcher.wait(timeout=DEADLINE_S) == 0
        err.wait_for(f"capsulectl terminate {session_id}".encode(), timeout_s=DEADLINE_S)
    finally:
        _release(go)  # a CMD still waiting (a failed step) exits, not left behind blocked
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        assert launcher.stderr is not None
        launcher.stderr.close()
    # A last-moment child may still be a fork of bash when the launcher exits.
    pids = leftovers.running(token, pattern.count, timeout_s=DEADLINE_S)
    report = bytes(err.seen).decode()
    # At CMD's exit: one line per process, with its command.
    for pid in pids:
        assert any(
            line.split()[:1] == [str(pid)] and f"sleep {token}" in line
            for line in report.splitlines()
        ), report
    # After the launcher has exited: still listed, as found.
    assert _listed_under(sock, session_id, pids, launcher.pid), session_processes(sock, session_id)
    # And stoppable by the command the report names.
    with Client(sock) as client:
        outcome = client.terminate(session_id, grace_s=2.0)
    assert {p.pid: p.outcome for p in outcome.processes} == dict.fromkeys(pids, "exited")
    assert leftovers.pids(token) == []
