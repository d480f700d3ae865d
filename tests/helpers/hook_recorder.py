"""A Claude Code hook that records what it was given: ``python hook_recorder.py DIR [options]``.

Claude Code runs a command hook with the event's JSON on stdin. This one
writes one file per call into DIR (``<ns>-<pid>-<event>.json``): the event as
parsed, its whole environment, its argv, and its ancestry from ``/proc`` (pid,
ppid, comm and argv of itself and of each ancestor up to pid 1). Then it
answers as told:

    --print TEXT    write TEXT on stdout (a ``hookSpecificOutput`` JSON, say)
    --stderr TEXT   write TEXT on stderr
    --exit N        exit with N (default 0)
    --sleep S       sleep S seconds before answering (a hook's ``timeout``)

Standard library only, and no import of the test helpers: it runs under
whatever environment Claude Code gives its hooks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def process(pid: int) -> dict[str, Any] | None:
    """pid, ppid, comm and argv of ``pid`` from /proc; ``None`` once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return {
        "pid": pid,
        "ppid": ppid,
        "comm": comm,
        "argv": [part.decode(errors="replace") for part in argv if part],
    }


def ancestry(pid: int) -> list[dict[str, Any]]:
    """``pid`` and its ancestors, nearest first, up to pid 1."""
    chain = []
    while pid > 0 and (entry := process(pid)) is not None:
        chain.append(entry)
        if pid == 1:
            break
        pid = entry["ppid"]
    return chain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--print", dest="stdout", default=None)
    parser.add_argument("--stderr", default=None)
    parser.add_argument("--exit", dest="status", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    options = parser.parse_args(argv)
    started_ns = time.time_ns()
    raw = sys.stdin.read()
    try:
        event: Any = json.loads(raw)
    except ValueError:
        event = raw
    name = event.get("hook_event_name", "unknown") if isinstance(event, dict) else "unknown"
    record = {
        "started_ns": started_ns,
        "event": event,
        "env": dict(os.environ),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "ancestry": ancestry(os.getpid()),
    }
    options.directory.mkdir(parents=True, exist_ok=True)
    final = options.directory / f"{started_ns}-{os.getpid()}-{name}.json"
    partial = final.with_suffix(".part")
    partial.write_text(json.dumps(record, indent=1))
    partial.rename(final)
    if options.sleep:
        time.sleep(options.sleep)
    if options.stdout is not None:
        sys.stdout.write(options.stdout)
    if options.stderr is not None:
        sys.stderr.write(options.stderr)
    return options.status


if __name__ == "__main__":
    sys.exit(main())
