"""``capsulectl service install|uninstall`` where no systemd user manager runs
(docs/install.md): what it writes, what it runs, what it keeps, and that the
units it writes pass ``systemd-analyze verify``.

Each test runs the venv's ``capsulectl`` as a user would, with ``HOME`` and
``XDG_CONFIG_HOME`` in the test's own directory. A user manager is absent here
(and in CI): the tests with one running are in test_user_manager.py.
"""

from __future__ import annotations

import os
import plistlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess

from capsule_client.cli.service_files import (
    FileState,
    launch_agent,
    state_of,
    systemd_exec_path,
    systemd_units,
)

BIN = Path(sys.executable).parent
CAPSULECTL = BIN / "capsulectl"
CAPSULED = BIN / "capsuled"
ROOT = Path(__file__).parents[3]

needs_systemctl = pytest.mark.skipif(
    shutil.which("systemctl") is None, reason="systemctl is not installed (apt-get install systemd)"
)
needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (apt-get install systemd)",
)


def user_manager_runs() -> bool:
    done = subprocess.run(
        ["systemctl", "--user", "is-system-running"], capture_output=True, text=True
    )
    return done.stdout.strip() not in ("", "offline", "unknown")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A user's environment with a home of the test's own, no manager reachable."""
    home = tmp_path / "user"
    home.mkdir()
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CAPSULE", "XDG_", "DBUS_"))
    }
    return {**environ, "HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "config")}


def unit_dir(env: dict[str, str]) -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"


def service(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CAPSULECTL), "service", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def tree(path: Path) -> dict[str, str]:
    """Every entry under ``path``: a file's text, a link's target, a directory's mark."""
    found = {}
    for entry in sorted(path.rglob("*")) if path.exists() else []:
        name = str(entry.relative_to(path))
        if entry.is_symlink():
            found[name] = "-> " + os.readlink(entry)
        elif entry.is_dir():
            found[name] = "dir"
        else:
            found[name] = entry.read_text()
    return found


@needs_systemctl
def test_dry_run_shows_both_units_and_the_commands_and_changes_nothing(
    env: dict[str, str], tmp_path: Path
) -> None:
    if user_manager_runs():
        pytest.skip("a systemd user manager runs here")
    done = service(env, "install", "--dry-run")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"would write {unit_dir(env)}/capsuled.socket:" in out
    assert f"would write {unit_dir(env)}/capsuled.service:" in out
    assert f"    ExecStart={CAPSULED}" in out
    assert "would run: systemctl --user enable capsuled.socket" in out
    assert "No systemd user manager runs here" in out
    assert "The socket would be enabled" in out  # a dry run enables nothing
    assert not (tmp_path / "config").exists()
    # And uninstall's dry run, with the units in place, removes nothing either.
    assert service(env, "install").returncode == 0
    before = tree(tmp_path / "config")
    done = service(env, "uninstall", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"would remove {unit_dir(env)}/capsuled.service" in done.stdout
    assert tree(tmp_path / "config") == before


@needs_systemctl
def test_install_writes_the_units_naming_the_capsuled_beside_capsulectl(
    env: dict[str, str],
) -> None:
    if user_manager_runs():
        pytest.skip("a systemd user manager runs here")
    done = service(env, "install")
    assert done.returncode == 0, done.stderr
    units = unit_dir(env)
    text = (units / "capsuled.service").read_text()
    assert f"\nExecStart={CAPSULED}\n" in text
    assert "\nExecSearchPath=" not in text
    assert "ListenStream=%t/capsuled.sock" in (units / "capsuled.socket").read_text()
    # Enabled as systemctl enables without a manager: a link in the target's wants.
    wants = units / "sockets.target.wants" / "capsuled.socket"
    assert wants.is_symlink() and wants.resolve() == (units / "capsuled.socket").resolve()
    mode = stat.S_IMODE((units / "capsuled.service").stat().st_mode)
    assert mode == 0o644
    # How to run it meanwhile, what to run once a manager runs, and how to check it.
    assert "No systemd user manager runs here" in done.stdout
    assert "The socket is enabled" in done.stdout
    assert f"setsid {CAPSULED} >/dev/null 2>&1 &" in done.stdout
    assert "systemctl --user start capsuled.socket" in done.stdout
    assert "capsulectl ping" in done.stdout
    assert "systemctl --user status capsuled" in done.stdout


@needs_systemctl
@needs_analyze
def test_the_written_units_pass_systemd_analyze_verify(env: dict[str, str]) -> None:
    assert service(env, "install").returncode == 0
    units = sorted(str(path) for path in unit_dir(env).glob("capsuled.*"))
    done = subprocess.run(
        ["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


@needs_analyze
def test_an_executable_path_with_spaces_and_specifiers_verifies(tmp_path: Path) -> None:
    """``ExecStart=`` quotes and escapes the path; a path verify cannot run fails."""
    odd = tmp_path / "a dir %i $HOME" / "capsuled"
    odd.parent.mkdir()
    shutil.copy(CAPSULED, odd)
    units = tmp_path / "units"
    units.mkdir()
    for file in systemd_units(odd, units):
        file.path.write_text(file.text)
    assert systemd_exec_path(odd).startswith('"')

    def verify() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "systemd-analyze",
                "verify",
                str(units / "capsuled.socket"),
                str(units / "capsuled.service"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = verify()
    assert done.returncode == 0, done.stderr
    odd.unlink()  # the check can fail: verify looks the executable up
    done = verify()
    assert done.returncode != 0 and "is not executable" in done.stderr


@needs_systemctl
def test_install_again_changes_nothing_and_replaces_its_own_older_units(
    env: dict[str, str],
) -> None:
    assert service(env, "install").returncode == 0
    first = tree(unit_dir(env))
    done = service(env, "install")
    assert done.returncode == 0, done.stderr
    assert f"unchanged {unit_dir(env)}/capsuled.service" in done.stdout
    assert tree(unit_dir(env)) == first
    # Units an older install wrote for another capsuled are its own: replaced.
    for file in systemd_units(Path("/opt/old/bin/capsuled"), unit_dir(env)):
        file.path.write_text(file.text)
    done = service(env, "install")
    assert done.returncode == 0, done.stderr
    assert f"replaced {unit_dir(env)}/capsuled.service" in done.stdout
    assert tree(unit_dir(env)) == first


@needs_systemctl
def test_a_unit_edited_or_copied_by_hand_is_never_overwritten(env: dict[str, str]) -> None:
    units = unit_dir(env)
    units.mkdir(parents=True)
    by_hand = (ROOT / "systemd" / "capsuled.service").read_text()
    (units / "capsuled.service").write_text(by_hand)
    done = service(env, "install")
    assert done.returncode == 1
    assert "was not written by capsulectl service install" in done.stderr
    assert "nothing was changed" in done.stderr
    assert sorted(p.name for p in units.iterdir()) == ["capsuled.service"]
    assert (units / "capsuled.service").read_text() == by_hand
    # Edited after capsulectl wrote it: kept as well.
    (units / "capsuled.service").unlink()
    assert service(env, "install").returncode == 0
    edited = (units / "capsuled.service").read_text() + "Environment=CAPSULE_HOME=/srv/x\n"
    (units / "capsuled.service").write_text(edited)
    done = service(env, "install")
    assert done.returncode == 1 and "was edited since capsulectl wrote it" in done.stderr
    assert (units / "capsuled.service").read_text() == edited


@needs_systemctl
def test_uninstall_removes_exactly_what_install_wrote_and_names_what_stays(
    env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "config"
    (config / "systemd" / "user" / "capsuled.service.d").mkdir(parents=True)
    (config / "systemd" / "user" / "capsuled.service.d" / "home.conf").write_text("[Service]\n")
    (config / "other.conf").write_text("kept\n")
    home = Path(env["HOME"]) / ".local" / "state" / "capsule"
    home.mkdir(parents=True)
    before = tree(config)
    assert service(env, "install").returncode == 0
    done = service(env, "uninstall")
    assert done.returncode == 0, done.stderr
    assert tree(config) == before
    assert f"removed {unit_dir(env)}/capsuled.socket" in done.stdout
    assert f"rm -rf {home}" in done.stdout
    assert home.is_dir()  # the home stays
    # Again: nothing to do, and it says so.
    done = service(env, "uninstall")
    assert done.returncode == 0, done.stderr
    assert "nothing to stop or remove" in done.stdout
    assert tree(config) == before


@needs_systemctl
def test_uninstall_without_a_manager_names_the_daemon_it_could_not_stop(
    env: dict[str, str], daemon: DaemonProcess
) -> None:
    """Started by hand where no user manager runs, capsuled outlives its units: uninstall
    says so, with the pid to stop."""
    if user_manager_runs():
        pytest.skip("a systemd user manager runs here")
    assert service(env, "install").returncode == 0
    done = service(env, "--socket", str(daemon.socket_path), "uninstall")
    assert done.returncode == 0, done.stderr
    pid = daemon.pid
    assert f"a capsuled (pid {pid}) still serves {daemon.socket_path}" in done.stdout
    assert f"kill {pid}" in done.stdout
    # Stopped, it is not named.
    assert service(env, "install").returncode == 0
    daemon.stop()
    done = service(env, "--socket", str(daemon.socket_path), "uninstall")
    assert done.returncode == 0, done.stderr
    assert "still serves" not in done.stdout


@needs_systemctl
def test_uninstall_keeps_an_edited_unit_and_exits_1(env: dict[str, str]) -> None:
    assert service(env, "install").returncode == 0
    units = unit_dir(env)
    edited = (units / "capsuled.socket").read_text().replace("0600", "0660")
    (units / "capsuled.socket").write_text(edited)
    done = service(env, "uninstall")
    assert done.returncode == 1
    assert f"kept {units}/capsuled.socket: it was edited since capsulectl wrote it" in done.stdout
    assert f"rm {units}/capsuled.socket" in done.stdout
    assert (units / "capsuled.socket").read_text() == edited
    assert not (units / "capsuled.service").exists()
    assert not (units / "sockets.target.wants" / "capsuled.socket").exists()  # disabled


def test_the_launch_agent_names_capsuled_and_the_home_and_parses(tmp_path: Path) -> None:
    home = tmp_path / "Users" / "a & b"
    agent = launch_agent(Path("/opt/cap <1>/bin/capsuled"), home)
    assert agent.path == home / "Library" / "LaunchAgents" / "dev.capsuled.plist"
    plist = plistlib.loads(agent.text.encode())
    assert plist["Label"] == "dev.capsuled"
    assert plist["ProgramArguments"] == ["/opt/cap <1>/bin/capsuled"]
    assert plist["StandardErrorPath"] == f"{home}/Library/Logs/capsuled.log"
    assert plist["EnvironmentVariables"]["CAPSULED_SOCKET"] == (
        f"{home}/.local/state/capsule/capsuled.sock"
    )
    assert "@HOME@" not in agent.text
    agent.path.parent.mkdir(parents=True)
    agent.path.write_text(agent.text)
    assert state_of(agent.path, agent.text) is FileState.SAME
    assert state_of(agent.path, "") is FileState.OURS
    agent.path.write_text(agent.text.replace("<integer>10</integer>", "<integer>30</integer>"))
    assert state_of(agent.path, agent.text) is FileState.EDITED


def test_a_link_in_a_units_place_is_not_capsulectls(tmp_path: Path) -> None:
    [socket_unit, _] = systemd_units(CAPSULED, tmp_path)
    socket_unit.path.symlink_to(ROOT / "systemd" / "capsuled.socket")
    assert state_of(socket_unit.path, socket_unit.text) is FileState.FOREIGN
    assert state_of(tmp_path / "missing", "") is FileState.MISSING


@needs_systemctl
def test_a_home_too_long_for_a_socket_is_no_matter_to_service(env: dict[str, str]) -> None:
    """``service`` asks no daemon: the socket's path in a deep home is not a usage error."""
    deep = Path(env["HOME"]) / ("d" * 100)
    deep.mkdir()
    done = service({**env, "HOME": str(deep)}, "install", "--dry-run")
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [str(CAPSULECTL), "ping"], env={**env, "HOME": str(deep)}, capture_output=True, text=True
    )
    assert done.returncode == 2 and "longer than the 107 bytes" in done.stderr  # ping asks
