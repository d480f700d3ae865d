"""What registers processes records their exact identity: ``capsulectl run``'s launcher row
and the demo runtime's receipts (docs/design.md §14), read back from the files they wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.demo import demo_session
from helpers.world import make_home

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the exact identity is Linux's"
)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

#: Run under the launcher: its row, as the store has it, and its ticks as the kernel says.
READ_ROW = """
import json, os, sqlite3, sys
launcher = os.getppid()
db = sqlite3.connect(os.path.join(os.environ["CAPSULE_HOME"], "capsule.db"))
row = db.execute(
    "SELECT boot_id, start_ticks FROM session_processes WHERE pid = ? AND session_id = ?",
    (launcher, os.environ["CAPSULE_SESSION_ID"]),
).fetchone()
data = open(f"/proc/{launcher}/stat", "rb").read()
ticks = int(data[data.rindex(b")") + 2:].split()[19])
print(json.dumps({"row": row, "ticks": ticks}))
"""


def test_the_launchers_row_carries_its_boot_id_and_start_ticks(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    env = {**os.environ, "CAPSULE_HOME": str(home), "CAPSULED_SOCKET": str(tmp_path / "no.sock")}
    capsulectl_run = [sys.executable, "-m", "capsule_client.cli", "run", "--session", "ses_run"]
    run = subprocess.run(
        [*capsulectl_run, "--", sys.executable, "-c", READ_ROW],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["row"] == [BOOT_ID.read_text().strip(), seen["ticks"]]


def test_the_demo_runtimes_receipts_carry_their_processs_identity(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with demo_session(home) as (_, pids):
        receipts = [
            *(home / "runtime" / "exec-processes").glob("*.json"),
            *(home / "runs").glob("*/*/provider-clients/*.json"),
        ]
        assert len(receipts) == 3
        for path in receipts:
            receipt = json.loads(path.read_bytes())
            assert receipt["pid"] in pids
            data = Path(f"/proc/{receipt['pid']}/stat").read_bytes()
            ticks = int(data[data.rindex(b")") + 2 :].split()[19])
            assert (receipt["boot_id"], receipt["start_ticks"]) == (
                BOOT_ID.read_text().strip(),
                ticks,
            )
