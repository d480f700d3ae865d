"""docs/install.md runs as written: its marked blocks, command by command, in order.

The shell is a user's in a home of the test's own: ``HOME`` a fresh directory, pipx's
directories in it (``~/.local/bin`` on ``PATH``, as ``pipx ensurepath`` leaves it),
no ``XDG_RUNTIME_DIR`` (so no user manager is reached: ``service install`` enables the
socket without starting it), and the working directory a copy of the checkout. Each
command must exit with the marker's status (0 unless it says ``status=N``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.doc_blocks import marked_blocks
from installs import ROOT, clean_env

#: Building and installing from an index take minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

GUIDE = ROOT / "docs" / "install.md"


def commands(text: str) -> list[str]:
    """The block's commands: one a line, comments and blank lines left out."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_install_guide_runs_as_written(checkout: Path, tmp_path: Path) -> None:
    home = tmp_path / "user"
    home.mkdir()
    env = clean_env(
        HOME=str(home),
        PIPX_HOME=str(home / ".local" / "pipx"),
        PIPX_BIN_DIR=str(home / ".local" / "bin"),
        PIPX_MAN_DIR=str(home / ".local" / "share" / "man"),
    )
    tools = tmp_path / "tools"  # pipx, from the test extras, as the user's own
    tools.mkdir()
    (tools / "pipx").symlink_to(Path(sys.executable).parent / "pipx")
    env["PATH"] = os.pathsep.join([f"{home}/.local/bin", str(tools), env["PATH"]])
    blocks = [block for block in marked_blocks(GUIDE) if block.kind == "run"]
    assert blocks, "docs/install.md has runnable blocks"
    ran: list[str] = []
    for block in blocks:
        for command in commands(block.text):
            done = subprocess.run(
                ["bash", "-c", f"set -o pipefail\n{command}"],
                cwd=checkout,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=900,
            )
            expected = int(block.options.get("status", "0"))
            assert done.returncode == expected, (
                f"{block.where}: {command!r} exited {done.returncode}, not {expected}\n"
                f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
            )
            ran.append(shlex.split(command, comments=True)[0])
    # The guide's steps, each run: install, service, upgrade, remove.
    assert {"pipx", "capsuled", "capsulectl", "rm"} <= set(ran), ran
    units = home / ".config" / "systemd" / "user"
    assert not (units / "capsuled.service").exists()  # uninstalled again
    assert not (home / ".local" / "bin" / "capsulectl").exists()
    assert not (home / ".local" / "state" / "capsule").exists()
