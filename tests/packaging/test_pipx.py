"""``pipx install .`` from a checkout, the MCP extra added the two ways docs/install.md
gives, an upgrade over a running install, and ``pipx uninstall`` (docs/install.md).

pipx comes from the test extras; ``PIPX_HOME``, ``PIPX_BIN_DIR`` and ``PIPX_MAN_DIR``
point into the test's directory, so nothing of the user's pipx is touched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from installs import clean_env, run, serve_and_ping

from capsule_client.wire.constants import VERSION

#: Building and installing from an index take minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def pipx_env(tmp_path: Path, home: Path) -> dict[str, str]:
    """pipx's directories in ``tmp_path``; ``home`` short, as the default socket is in it."""
    return clean_env(
        PIPX_HOME=str(tmp_path / "pipx"),
        PIPX_BIN_DIR=str(tmp_path / "bin"),
        PIPX_MAN_DIR=str(tmp_path / "man"),
        HOME=str(home),
    )


def pipx(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    done = run([sys.executable, "-m", "pipx", *args], env=env, cwd=cwd)
    assert done.returncode == 0, done.stdout[-5000:]
    return done.stdout


def initialize(capsulectl: Path, env: dict[str, str]) -> dict[str, object]:
    """``capsulectl mcp``'s answer to an MCP ``initialize``, over stdio as a host asks."""
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "tests", "version": "1"},
        },
    }
    done = subprocess.run(
        [str(capsulectl), "mcp"],
        input=json.dumps(request) + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reply: dict[str, object] = json.loads(done.stdout.splitlines()[0])
    return reply


def test_pipx_install_from_a_checkout_then_the_mcp_extra_then_uninstall(
    checkout: Path, tmp_path: Path, short_home: Path
) -> None:
    env = pipx_env(tmp_path, short_home)
    bin_dir = tmp_path / "bin"
    pipx(env, "install", ".", cwd=checkout)  # as docs/install.md says, in the checkout
    assert sorted(path.name for path in bin_dir.iterdir()) == ["capsulectl", "capsuled"]
    assert run([str(bin_dir / "capsuled"), "--version"]).stdout == f"capsuled {VERSION}\n"
    assert run([str(bin_dir / "capsulectl"), "--version"]).stdout == f"capsulectl {VERSION}\n"
    assert f"capsuled {VERSION} is running on" in serve_and_ping(bin_dir)

    # Without the extra, capsulectl mcp names what works; `pip install 'capsuled[mcp]'`
    # would not: capsuled is on no index.
    done = run([str(bin_dir / "capsulectl"), "mcp"], env=env)
    assert done.returncode == 2
    assert "pipx inject capsuled mcp" in done.stdout
    pipx(env, "inject", "capsuled", "mcp")
    reply = initialize(bin_dir / "capsulectl", env)
    assert reply["result"]["serverInfo"]["name"] == "capsuled", reply  # type: ignore[index]

    # Installed again from the checkout with the extra, as after a `git pull`: an upgrade.
    pipx(env, "install", "--force", ".[mcp]", cwd=checkout)
    reply = initialize(bin_dir / "capsulectl", env)
    assert reply["result"]["serverInfo"]["name"] == "capsuled", reply  # type: ignore[index]
    assert f"capsuled {VERSION} is running on" in serve_and_ping(bin_dir)

    pipx(env, "uninstall", "capsuled")
    assert list(bin_dir.iterdir()) == []
