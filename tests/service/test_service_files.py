"""The systemd units and the LaunchAgent as shipped (docs/design.md §8)."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "systemd" / "capsuled.service"
SOCKET = ROOT / "systemd" / "capsuled.socket"
PLIST = ROOT / "launchd" / "dev.capsuled.plist"

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze missing"
)


def unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value given (a unit may repeat a key)."""
    sections: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        sections[section][key.strip()].append(value.strip())
    return sections


def verify(directory: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    return subprocess.run(
        [
            "systemd-analyze",
            "--user",
            "verify",
            str(directory / "capsuled.service"),
            str(directory / "capsuled.socket"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


@needs_systemd_analyze
def test_units_verify_reporting_at_most_the_missing_executable(tmp_path: Path) -> None:
    result = verify(SERVICE.parent, tmp_path)
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    allowed = "capsuled.service: Command capsuled is not executable"
    assert all(line.startswith(allowed) for line in complaints), complaints
    assert result.returncode == 0 or complaints


@needs_systemd_analyze
def test_units_verify_cleanly_once_the_executable_exists(tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    shutil.copy(SOCKET, units / "capsuled.socket")
    text = SERVICE.read_text().replace("ExecStart=capsuled", f"ExecStart={sys.executable}")
    (units / "capsuled.service").write_text(text)
    result = verify(units, tmp_path)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_service_unit_settings() -> None:
    service = unit_settings(SERVICE)["Service"]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert service["Restart"] == ["on-failure"]
    assert service["ExecStart"] == ["capsuled"]
    search_path = service["ExecSearchPath"][0].split(":")
    assert search_path[0] == "%h/.local/bin"
    assert "/usr/bin" in search_path
    assert int(service["WatchdogSec"][0]) > 0
    for hardening in (
        "NoNewPrivileges",
        "LockPersonality",
        "RestrictRealtime",
        "MemoryDenyWriteExecute",
    ):
        assert service[hardening] == ["yes"], hardening
    assert service["SystemCallArchitectures"] == ["native"]
    assert service["RestrictAddressFamilies"] == ["AF_UNIX"]
    # The daemon must see every process of the user and the user's files.
    hidden = {"ProtectProc", "PrivatePIDs", "PrivateTmp", "ProtectHome", "PrivateUsers"}
    assert hidden.isdisjoint(service)


def test_socket_unit_settings() -> None:
    socket_section = unit_settings(SOCKET)["Socket"]
    assert socket_section["ListenStream"] == ["%t/capsuled.sock"]
    assert socket_section["SocketMode"] == ["0600"]
    assert socket_section.get("Accept", ["no"]) == ["no"]


MDWE_CHILD = """
import ctypes, os, sys
PR_SET_MDWE, PR_GET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 66, 1
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
    sys.exit(77)
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""

MDWE_WORK = """
import ctypes, sqlite3, anyio, msgspec, psutil, structlog, uuid_utils, watchfiles
import capsuled.rpc.sockets
assert ctypes.CDLL(None).prctl(66, 0, 0, 0, 0) == 1, "MDWE not inherited"
psutil.process_iter.cache_clear()
assert any(p.info["create_time"] for p in psutil.process_iter(["create_time"]))
msgspec.json.decode(msgspec.json.encode({"a": [1, 2]}))
sqlite3.connect(":memory:").execute("select 1").fetchall()
anyio.run(anyio.sleep, 0.01)
import pathlib, tempfile, threading
watched = pathlib.Path(tempfile.mkdtemp())
threading.Timer(0.2, (watched / "r.json").write_text, ["{}"]).start()
for changes in watchfiles.watch(watched, rust_timeout=5000, yield_on_timeout=True):
    assert any(path.endswith("r.json") for _, path in changes), changes
    break
import shutil
shutil.rmtree(watched)
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_MDWE is Linux-only")
def test_python_and_the_daemon_libraries_run_with_memory_deny_write_execute() -> None:
    """``MemoryDenyWriteExecute=yes`` is only safe if nothing maps W+X memory."""
    result = subprocess.run(
        [sys.executable, "-c", MDWE_CHILD, MDWE_WORK], capture_output=True, text=True, timeout=30
    )
    if result.returncode == 77:
        pytest.skip("kernel without PR_SET_MDWE (Linux < 6.3)")
    assert (result.returncode, result.stdout, result.stderr) == (0, "ok\n", "")


def test_launch_agent_is_a_valid_plist_that_restarts_on_crash() -> None:
    with PLIST.open("rb") as stream:
        agent = plistlib.load(stream)
    assert agent["Label"] == PLIST.stem
    assert agent["RunAtLoad"] is True
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["ProgramArguments"] == ["/usr/bin/env", "capsuled"]
    assert agent["EnvironmentVariables"]["CAPSULED_SOCKET"].endswith("/capsuled.sock")
    assert agent["StandardOutPath"] and agent["StandardErrorPath"]


def test_launch_agent_paths_are_absolute_once_installed() -> None:
    """`capsulectl service install` substitutes @HOME@; every path must then be absolute."""
    home = "/Users/someone"
    installed = plistlib.loads(PLIST.read_bytes().replace(b"@HOME@", home.encode()))
    paths = [
        installed["StandardOutPath"],
        installed["StandardErrorPath"],
        installed["EnvironmentVariables"]["CAPSULED_SOCKET"],
        *installed["EnvironmentVariables"]["PATH"].split(":"),
    ]
    assert all(p.startswith("/") and "@" not in p for p in paths), paths
    assert installed["EnvironmentVariables"]["PATH"].startswith(f"{home}/.local/bin:")
    from capsule_client.cli.service_files import launch_agent

    written = launch_agent(Path("/opt/bin/capsuled"), Path(home)).text
    assert "@HOME@" not in written
    assert plistlib.loads(written.encode())["StandardOutPath"] == installed["StandardOutPath"]
