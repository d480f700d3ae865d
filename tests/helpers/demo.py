"""examples/demo_runtime.py run on a home, its session's processes killed afterwards."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEMO = Path(__file__).parents[2] / "examples" / "demo_runtime.py"


@contextmanager
def demo_session(home: Path) -> Iterator[tuple[str, list[int]]]:
    """Run examples/demo_runtime.py on ``home``; yield what it printed and its pids.

    The demo leaves its session's processes running (``sleep 60``, and a shell
    with two; pids in the order of its "Kill all:" line); their process groups
    are killed on the way out, whatever the test did.
    """
    result = subprocess.run(
        [sys.executable, DEMO, "--home", str(home), "--sleep-s", "60"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    kill_all = re.search(r"^Kill all: kill ([\d ]+)$", result.stdout, re.MULTILINE)
    assert kill_all, result.stdout
    pids = [int(pid) for pid in kill_all.group(1).split()]
    try:
        yield result.stdout, pids
    finally:
        for pid in pids:  # each leads its own process group: the shell's sleeps go with it
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
