"""``capsulectl service`` with a real systemd user manager (docs/install.md).

No user manager runs on a container's shell or in CI, so the test starts one:
``systemd --user`` in mount and pid namespaces of its own, where a tmpfs over
``/run/systemd`` holds the ``system`` directory systemd looks for, with ``HOME``,
``XDG_RUNTIME_DIR`` and ``XDG_STATE_HOME`` in the test's directory. When the
script's shell (the namespace's pid 1) ends, however it ends, the kernel ends the
manager and the daemon it started. It needs root (for the namespaces) and systemd;
elsewhere it is skipped and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SYSTEMD = Path("/lib/systemd/systemd")
#: Mount and pid namespaces: the tmpfs is the script's own, and the kernel ends every
#: process in them when the script's shell, their pid 1, ends.
NAMESPACES = ("unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private")

SCRIPT = """\
mount -t tmpfs tmpfs /run/systemd || exit 97
mkdir /run/systemd/system
"$SYSTEMD" --user >"$OUT/manager.log" 2>&1 &
for _ in $(seq 300); do  # up to 30 s for the manager to come up
    case $(systemctl --user is-system-running 2>/dev/null) in running|degraded) break;; esac
    sleep 0.1
done
step() { name=$1; shift; "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; echo $? >"$OUT/$name.rc"; }
step install capsulectl service install
step ping capsulectl --timeout 30 ping
step status capsulectl --timeout 30 status --json
step unit systemctl --user show -p ExecStart -p ActiveState -p StatusText capsuled.service
step again capsulectl service install
step restart systemctl --user restart capsuled.service
step status2 capsulectl --timeout 30 status --json
step uninstall capsulectl service uninstall
step gone capsulectl ping
step units ls -A "$XDG_CONFIG_HOME/systemd/user"
"""


def can_run() -> str | None:
    """Why the test cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root for mount and pid namespaces"
    if not SYSTEMD.exists() or shutil.which("systemctl") is None:
        return "systemd is not installed (apt-get install systemd)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    return None


@pytest.mark.slow
def test_install_starts_the_socket_the_daemon_answers_and_uninstall_stops_it(
    tmp_path: Path,
) -> None:
    if (why := can_run()) is not None:
        pytest.skip(why)
    out = tmp_path / "out"
    out.mkdir()
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CAPSULE", "XDG_", "DBUS_", "NOTIFY_", "LISTEN_"))
    }
    env |= {
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', os.defpath)}",
        "HOME": str(tmp_path / "user"),
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "SYSTEMD": str(SYSTEMD),
        "OUT": str(out),
    }
    (tmp_path / "user").mkdir()
    done = subprocess.run(
        [*NAMESPACES, "bash", "-c", SCRIPT],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    if done.returncode == 97 or "unshare failed" in done.stderr:
        pytest.skip(f"no namespaces here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr

    def step(name: str) -> tuple[int, str]:
        rc = int((out / f"{name}.rc").read_text())
        text = (out / f"{name}.out").read_text() + (out / f"{name}.err").read_text()
        return rc, text

    manager_log = (out / "manager.log").read_text()[-3000:]
    rc, text = step("install")
    assert rc == 0, text + manager_log
    assert "ran: systemctl --user enable --now capsuled.socket" in text
    assert "No systemd user manager" not in text
    rc, text = step("ping")
    assert rc == 0 and f"running on {runtime}/capsuled.sock" in text, text + manager_log
    rc, text = step("status")
    assert rc == 0, text
    status = json.loads(text)
    assert status["socket"] == f"{runtime}/capsuled.sock"
    assert status["home"] == f"{tmp_path}/state/capsule"
    rc, text = step("unit")
    assert f"path={BIN}/capsuled" in text, text
    assert "ActiveState=active" in text and "StatusText=ready" in text, text
    rc, text = step("again")
    assert rc == 0 and "unchanged" in text, text
    # The upgrade's last step: a restart serves on the same socket, from a new process.
    rc, text = step("restart")
    assert rc == 0, text
    rc, text = step("status2")
    assert rc == 0, text
    assert json.loads(text)["pid"] != status["pid"]
    rc, text = step("uninstall")
    assert rc == 0, text
    assert "ran: systemctl --user disable --now capsuled.socket capsuled.service" in text
    assert "ran: systemctl --user daemon-reload" in text
    rc, text = step("gone")
    assert rc == 3, text  # stopped: nothing listens any more
    rc, text = step("units")
    assert text == "", text
