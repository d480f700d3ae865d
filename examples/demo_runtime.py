#!/usr/bin/env python3
"""A pretend agent runtime: one session with a provider client and two exec processes.

The first exec is a shell that leaves background work behind, as agents'
shells do (``sleep N & (sleep N &); wait``): the daemon lists its two
``sleep`` processes as the session's descendants, the second under the
shell's entry although its parent (the subshell) has exited.

It uses only the writer kit that ships with the package (``capsule_client``):

1. registers a session, its input and its execs in the ownership store;
2. starts real background ``sleep`` processes (they outlive this script);
3. writes a provider-client receipt and exec receipts for them, each with
   its process's start read from the OS by the kit (on Linux its boot id
   and start ticks too: the daemon then names the process exactly, whatever
   the clock does, docs/design.md §14);
4. records the session's trace: ``session_start``, a trusted ``task_start``
   and a ``shell_detached`` per exec process that never reports an outcome,
   so a resumed session has something to reconcile;
5. prints what it did, and how to watch and kill the processes and reconcile
   the session: lines that work as pasted (``capsulectl`` by name when the
   shell finds this install's, else by its path beside this Python).

Run it with the same environment as the daemon (``CAPSULE_HOME`` or the
default home), then ``capsulectl sessions``::

    python examples/demo_runtime.py
    python examples/demo_runtime.py --home /tmp/capsule-demo --sleep-s 600
"""

from __future__ import annotations

import argparse
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from capsule_client.kit.paths import default_home, records_root, store_path
from capsule_client.kit.receipts import (
    make_private_dirs,
    write_exec_receipt,
    write_provider_client_receipt,
)
from capsule_client.kit.store import OwnershipStore
from capsule_client.kit.trace import TraceWriter


def start_sleep(seconds: int) -> int:
    """Start ``sleep`` in its own session, so it outlives this script; return its pid."""
    return start(["sleep", str(seconds)])


def start(argv: list[str]) -> int:
    """Start ``argv`` in its own session (and process group), so it outlives this script."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return process.pid


def capsulectl() -> str:
    """How a shell here runs this install's ``capsulectl``: its name, or its path."""
    beside = Path(sys.executable).parent / "capsulectl"
    found = shutil.which("capsulectl")
    if not beside.exists() or (found is not None and Path(found).samefile(beside)):
        return "capsulectl"
    return shlex.quote(str(beside))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--home", type=Path, default=None, help="capsule home (default: as capsuled)"
    )
    parser.add_argument("--sleep-s", type=int, default=3600, help="how long the processes live")
    args = parser.parse_args(argv)
    home: Path = (args.home or default_home()).expanduser().absolute()
    make_private_dirs(home)

    tag = secrets.token_hex(4)
    session_id = f"ses_demo_{tag}"
    context_id = f"ctx_demo_{tag}"
    task_id = f"tsk_demo_{tag}"
    input_id = f"inp_demo_{tag}"
    exec_ids = [f"exe_demo_{tag}_build", f"exe_demo_{tag}_test"]

    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id, context_id=context_id, title="demo session")
        store.register_input(input_id, session_id)
        for exec_id in exec_ids:
            store.register_exec(exec_id, session_id)

    trace = TraceWriter(records_root(home), session_id)
    trace.session_start()
    trace.task_start(task_id, "trusted", context_id=context_id)

    provider_pid = start_sleep(args.sleep_s)
    receipts = [
        (
            "provider client",
            provider_pid,
            write_provider_client_receipt(
                home, f"run_demo_{tag}", input_id, "client", provider_pid, provider="demo"
            ),
        )
    ]
    for exec_id in exec_ids:
        if exec_id.endswith("_build"):
            command = f"sleep {args.sleep_s} & (sleep {args.sleep_s} &); wait"
            pid = start(["sh", "-c", command])
        else:
            command = f"sleep {args.sleep_s}"
            pid = start_sleep(args.sleep_s)
        receipts.append(("exec", pid, write_exec_receipt(home, exec_id, pid, command=command)))
        trace.shell_detached(exec_id, "sleep", command, task_id=task_id)

    print(f"home:     {home}")
    print(f"store:    {store_path(home)}")
    print(f"session:  {session_id} (input {input_id}, execs {', '.join(exec_ids)})")
    for kind, pid, path in receipts:
        print(f"started:  {kind:<15} pid {pid:<7} receipt {path.relative_to(home)}")
    print()
    ctl = capsulectl()
    print(f"See it:   {ctl} sessions")
    print(f"Kill one: kill {receipts[-1][1]}   (it leaves at once: see `{ctl} watch`)")
    print(f"Kill all: kill {' '.join(str(pid) for _, pid, _ in receipts)}")
    print(f"Stop all: {ctl} terminate {session_id}   (the shell's sleeps too)")
    print(f"Resume:   {ctl} reconcile {session_id} --as ses_resumed --context {context_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
