"""What the packaging tests share: a copy of the checkout, fresh virtual environments,
an environment free of the machine's own settings, and a daemon of an install asked.

They build and install for real (``python -m build``, ``pip``, ``pipx``), so they take
tens of seconds each: every one is marked ``slow`` (``make test-slow``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[2]
#: What installing may take, seconds (packages come from an index).
INSTALL_TIMEOUT_S = 900


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would change how Python builds or where capsuled
    looks: no ``PYTHONDONTWRITEBYTECODE`` (its "byte-compiling is disabled" lines are
    not the project's), no virtual environment, no capsuled variables."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CAPSULE", "PYTHON", "VIRTUAL_ENV", "PIPX_", "XDG_"))
    }
    env["PATH"] = os.pathsep.join(
        entry
        for entry in env.get("PATH", os.defpath).split(os.pathsep)
        if entry and not (Path(entry) / "capsulectl").exists()
    )
    return {**env, **extra}


def run(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end; its output, stdout and stderr together."""
    return subprocess.run(
        argv,
        env=clean_env() if env is None else env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )


def copy_checkout(destination: Path) -> Path:
    """The checkout's files as git sees them (tracked, and new ones not ignored), links
    kept as links, in ``destination``: builds there leave the checkout as it is."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if not os.path.lexists(source):
            continue  # deleted in the work tree
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    return destination


def fresh_venv(path: Path) -> Path:
    """A virtual environment without pip (the suite's pip installs into it,
    ``pip --python``); its ``bin`` directory."""
    done = run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    assert done.returncode == 0, done.stdout
    return path / "bin"


def pip_into(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``pip install ARGS`` into the environment of ``bin_dir``, with this suite's pip."""
    return run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", *args])


def answers_ping(socket_path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(socket_path))
            sock.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
            return b'"pong":true' in sock.makefile("rb").readline()
    except OSError:
        return False


def serve_and_ping(bin_dir: Path, capsulectl: Path | None = None) -> str:
    """Start the ``capsuled`` of ``bin_dir`` on a home and socket of its own, wait until
    it answers, and return what ``capsulectl ping`` (that of ``bin_dir`` unless given)
    prints; the daemon is stopped after."""
    with tempfile.TemporaryDirectory(prefix="capp", dir="/tmp") as name:
        home, sock = Path(name) / "home", Path(name) / "d.sock"
        env = clean_env(CAPSULE_HOME=str(home), CAPSULED_SOCKET=str(sock))
        with subprocess.Popen(
            [str(bin_dir / "capsuled")],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ) as daemon:
            try:
                deadline = time.monotonic() + 60
                while not answers_ping(sock):
                    assert daemon.poll() is None, "capsuled exited"
                    assert time.monotonic() < deadline, "capsuled did not answer within 60 s"
                    time.sleep(0.05)
                done = run([str(capsulectl or bin_dir / "capsulectl"), "ping"], env=env)
                assert done.returncode == 0, done.stdout
                return done.stdout
            finally:
                daemon.terminate()
                daemon.wait(timeout=30)
