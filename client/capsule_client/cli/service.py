"""``capsulectl service install|uninstall [--dry-run]``: capsuled as the user's service
(docs/install.md).

On Linux the systemd user units (``capsuled.socket``, ``capsuled.service``) go into
``$XDG_CONFIG_HOME/systemd/user`` (``~/.config/systemd/user``), the service running
the ``capsuled`` installed beside this ``capsulectl``; the socket is enabled and,
where a user manager runs, started. On macOS the LaunchAgent goes into
``~/Library/LaunchAgents`` and is bootstrapped. ``uninstall`` stops and disables
them and removes the files ``install`` wrote, never one edited since or put there
by hand (:mod:`.service_files`), and names what stays, and a daemon that no user
manager started and that still serves (it was started by hand).

Exit status: 0 done (also when no user manager runs: the socket is enabled and
starts with the next one; what to run meanwhile is said); 1 nothing was changed
because a file is not ``capsulectl``'s, no ``capsuled`` is installed beside
``capsulectl``, no service manager is there, or a command failed; for
``uninstall``, 1 also when a file was kept.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Final

from ..kit.paths import default_home, lock_path_for
from .exits import EXIT_OK, EXIT_REMOTE_ERROR
from .render.output import quiet_stdout
from .service_files import (
    LAUNCHD_LABEL,
    SERVICE_UNIT,
    SOCKET_UNIT,
    FileState,
    ServiceFile,
    launch_agent,
    launch_agents_dir,
    state_of,
    systemd_units,
    user_unit_dir,
)

__all__ = ["arguments", "installed_capsuled", "run"]

#: Seconds a ``systemctl`` or ``launchctl`` call may take.
COMMAND_TIMEOUT_S: Final = 60.0
#: The exit status when something could not be done (what and why are said).
EXIT_FAILED: Final = EXIT_REMOTE_ERROR
#: How long ``uninstall`` waits for a daemon still serving to say its pid, seconds.
STATUS_TIMEOUT_S: Final = 2.0
#: ``systemctl --user is-system-running`` when no user manager answers.
_NO_MANAGER: Final = ("", "offline", "unknown")

EPILOG: Final = """\
install writes the units (or the LaunchAgent) naming the capsuled installed beside
this capsulectl, enables them and, where the service manager runs, starts them.
uninstall stops and disables them and removes the files install wrote; a file
edited since, or put there by hand, is kept and named. The home (its store,
receipts and traces) stays: uninstall says where, and how to remove it.
--dry-run shows the files and the commands without writing or running anything."""


class _Failed(Exception):
    """What stopped the command, said as it is to the user."""


def arguments(parser: argparse.ArgumentParser) -> None:
    """``{install,uninstall} [--dry-run]``."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("action", choices=("install", "uninstall"), help="what to do")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would be written, removed and run, and change nothing",
    )


def installed_capsuled() -> Path | None:
    """The ``capsuled`` installed beside this ``capsulectl``: in the directory of the
    script that runs (its path as started, links kept: ``~/.local/bin`` for pipx), else
    in this interpreter's scripts directory; None when neither has one."""
    places = []
    if sys.argv and sys.argv[0]:
        places.append(Path(os.path.abspath(sys.argv[0])).parent)
    places.append(Path(sysconfig.get_path("scripts")))
    for place in places:
        candidate = place / "capsuled"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


class _Steps:
    """Writes, removals and commands, done and said, or only said (``--dry-run``)."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.heard = True  # until the reader of stdout leaves (`| head`): then steps go on

    def say(self, text: str) -> None:
        if not self.heard:
            return
        try:
            print(text, flush=True)
        except BrokenPipeError:
            self.heard = False
            quiet_stdout(sys.stdout)

    def write(self, file: ServiceFile, state: FileState) -> None:
        if state is FileState.SAME:
            self.say(f"unchanged {file.path}")
            return
        if self.dry_run:
            self.say(f"would write {file.path}:")
            self.say("".join(f"    {line}\n" for line in file.text.splitlines()).rstrip("\n"))
            return
        file.path.parent.mkdir(parents=True, exist_ok=True)
        staged = file.path.with_name(f".{file.path.name}.tmp")
        staged.write_text(file.text, encoding="utf-8")
        os.chmod(staged, 0o644)
        os.replace(staged, file.path)
        self.say(f"{'replaced' if state is FileState.OURS else 'wrote'} {file.path}")

    def remove(self, path: Path) -> None:
        if self.dry_run:
            self.say(f"would remove {path}")
            return
        path.unlink(missing_ok=True)
        self.say(f"removed {path}")

    def run(self, argv: list[str]) -> None:
        """Run ``argv`` (``--dry-run``: say it).

        Raises:
            _Failed: it could not run, or exited non-zero (its stderr is said).
        """
        line = shlex.join(argv)
        if self.dry_run:
            self.say(f"would run: {line}")
            return
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise _Failed(f"`{line}` failed: {exc}") from exc
        if done.returncode != 0:
            why = done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}"
            raise _Failed(f"`{line}` failed: {why}")
        self.say(f"ran: {line}")


def _err(text: str) -> None:
    print(f"capsulectl service: {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, socket_path: Path) -> int:
    """Install or uninstall the service for this platform; returns the exit status."""
    steps = _Steps(args.dry_run)
    try:
        if sys.platform == "darwin":
            if args.action == "install":
                return _launchd_install(steps)
            return _launchd_uninstall(steps, socket_path)
        if not sys.platform.startswith("linux"):
            raise _Failed(
                f"no service manager capsulectl knows on {sys.platform}: start `capsuled` "
                "another way (docs/install.md)"
            )
        if args.action == "install":
            return _systemd_install(steps)
        return _systemd_uninstall(steps, socket_path)
    except _Failed as exc:
        _err(str(exc))
        return EXIT_FAILED
    except OSError as exc:  # a file that could not be written or removed
        _err(f"{exc.filename or 'a file'}: {exc.strerror or exc}")
        return EXIT_FAILED


def _capsuled() -> Path:
    capsuled = installed_capsuled()
    if capsuled is None:
        raise _Failed(
            f"no capsuled is installed beside this capsulectl ({os.path.abspath(sys.argv[0])}, "
            f"{sysconfig.get_path('scripts')}): install both together (`pipx install .` in a "
            "checkout, docs/install.md), then run this again"
        )
    return capsuled


def _refuse_foreign(states: list[tuple[ServiceFile, FileState]]) -> None:
    """Raise when a file at a path to write is not ``capsulectl``'s to replace."""
    why = {
        FileState.EDITED: "was edited since capsulectl wrote it",
        FileState.FOREIGN: "was not written by capsulectl service install",
    }
    kept = [f"{file.path} {why[state]}" for file, state in states if state in why]
    if kept:
        raise _Failed(
            "nothing was changed: "
            + "; ".join(kept)
            + ". Move your settings into a drop-in (or away), remove the file, and run "
            "this again"
        )


# ---------------------------------------------------------------------- systemd


def _systemctl() -> str:
    """``systemctl``, run by that name (and so shown), once it is known to be there."""
    if shutil.which("systemctl") is None:
        raise _Failed(
            "systemctl is not installed here, so there are no systemd user units to "
            "manage: start `capsuled` another way (docs/install.md)"
        )
    return "systemctl"


def _user_manager(systemctl: str) -> str | None:
    """The user manager's state (``running``, ``degraded``, …), None when none answers."""
    try:
        done = subprocess.run(
            [systemctl, "--user", "is-system-running"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = done.stdout.strip()
    return None if state in _NO_MANAGER else state


def _systemd_install(steps: _Steps) -> int:
    capsuled = _capsuled()
    systemctl = _systemctl()
    files = systemd_units(capsuled, user_unit_dir())
    states = [(file, state_of(file.path, file.text)) for file in files]
    _refuse_foreign(states)
    manager = _user_manager(systemctl)
    for file, state in states:
        steps.write(file, state)
    user = [systemctl, "--user"]
    check = "    capsulectl ping\n    systemctl --user status capsuled"
    if manager is None:
        # Enabling makes links only: it needs no running manager.
        steps.run([*user, "enable", SOCKET_UNIT])
        enabled = "would be enabled" if steps.dry_run else "is enabled"
        steps.say(
            "\nNo systemd user manager runs here (`systemctl --user is-system-running` "
            f"answers offline), so nothing was started. The socket {enabled}: it starts "
            "with your user manager, at your next login (`loginctl enable-linger` keeps "
            "one running without a login). Until one runs, start capsuled yourself, in a "
            "terminal of its own or in the background, and check it:\n"
            f"    setsid {shlex.quote(str(capsuled))} >/dev/null 2>&1 &\n    capsulectl ping\n"
            "Once a user manager runs, start the socket without logging in again:\n"
            f"    systemctl --user daemon-reload\n    systemctl --user start {SOCKET_UNIT}\n"
            f"{check}"
        )
        return EXIT_OK
    steps.run([*user, "daemon-reload"])
    steps.run([*user, "enable", "--now", SOCKET_UNIT])
    if any(state is FileState.OURS for _, state in states):
        steps.run([*user, "try-restart", SERVICE_UNIT])  # a running daemon takes the new unit
    steps.say(
        f"\nThe socket listens; the first client starts capsuled ({capsuled}). "
        f"Check it with:\n{check}"
    )
    return EXIT_OK


def _systemd_uninstall(steps: _Steps, socket_path: Path) -> int:
    unit_dir = user_unit_dir()
    paths = [unit_dir / SOCKET_UNIT, unit_dir / SERVICE_UNIT]
    present = [path for path in paths if os.path.lexists(path)]
    if not present:
        steps.say(f"capsuled's units are not in {unit_dir}: nothing to stop or remove")
        _what_stays(steps, socket_path)
        return EXIT_OK
    systemctl = _systemctl()
    manager = _user_manager(systemctl)
    user = [systemctl, "--user"]
    names = [path.name for path in present]
    steps.run([*user, "disable", *(["--now"] if manager is not None else []), *names])
    kept = _remove_ours(steps, present)
    if manager is not None:
        steps.run([*user, "daemon-reload"])
    if manager is None and not steps.dry_run:
        _still_serving(steps, socket_path)
    for name in (SOCKET_UNIT, SERVICE_UNIT):
        drop_ins = unit_dir / f"{name}.d"
        if drop_ins.is_dir():
            steps.say(f"kept your drop-ins {drop_ins}: rm -r {shlex.quote(str(drop_ins))}")
    _what_stays(steps, socket_path)
    return EXIT_FAILED if kept else EXIT_OK


def _remove_ours(steps: _Steps, paths: list[Path]) -> list[Path]:
    """Remove each file ``capsulectl service install`` wrote and nobody edited since;
    say why each other one stays, and return those."""
    kept = []
    for path in paths:
        state = state_of(path, "")
        if state in (FileState.SAME, FileState.OURS):
            steps.remove(path)
        elif state is not FileState.MISSING:
            kept.append(path)
            how = (
                "was edited since capsulectl wrote it"
                if state is FileState.EDITED
                else "was not written by capsulectl service install"
            )
            steps.say(f"kept {path}: it {how}; remove it yourself: rm {shlex.quote(str(path))}")
    return kept


def _still_serving(steps: _Steps, socket_path: Path) -> None:
    """Say so when a capsuled still answers on ``socket_path``: no user manager ran it,
    so uninstalling the units did not stop it."""
    from ..client import Client
    from ..errors import CapsuleError

    try:
        with Client(socket_path, timeout_s=STATUS_TIMEOUT_S) as client:
            pid = client.status().pid
    except CapsuleError:
        return  # nothing answers there: nothing to stop
    steps.say(
        f"a capsuled (pid {pid}) still serves {socket_path}: no user manager started it, "
        f"so removing the units did not stop it; stop it: kill {pid}"
    )


def _what_stays(steps: _Steps, socket_path: Path) -> None:
    """Name what ``uninstall`` leaves, and how to remove it."""
    home = default_home()
    lines = ["", "What stays, for a later install or for you to remove:"]
    lines.append(
        f"  the home {home}: the ownership store, receipts and session traces; once no "
        f"session needs them: rm -rf {shlex.quote(str(home))}"
        if home.exists()
        else f"  nothing of the home {home}: it does not exist"
    )
    lock = lock_path_for(socket_path)
    if lock.exists():
        lines.append(
            f"  the daemon's lock file in the socket's directory {socket_path.parent}: "
            f"rm {shlex.quote(str(lock))}"
        )
    steps.say("\n".join(lines))


# ---------------------------------------------------------------------- launchd


def _launchctl() -> str:
    return "launchctl" if shutil.which("launchctl") else "/bin/launchctl"


def _loaded(launchctl: str, target: str) -> bool:
    try:
        done = subprocess.run(
            [launchctl, "print", target],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _launchd_install(steps: _Steps) -> int:
    capsuled = _capsuled()
    agent = launch_agent(capsuled)
    state = state_of(agent.path, agent.text)
    _refuse_foreign([(agent, state)])
    launchctl = _launchctl()
    domain = f"gui/{os.getuid()}"
    target = f"{domain}/{LAUNCHD_LABEL}"
    loaded = _loaded(launchctl, target)
    if not steps.dry_run:
        (Path.home() / "Library" / "Logs").mkdir(parents=True, exist_ok=True)
    steps.write(agent, state)
    if loaded and state is not FileState.SAME:
        steps.run([launchctl, "bootout", target])  # to load the new file
    if not loaded or state is not FileState.SAME:
        steps.run([launchctl, "bootstrap", domain, str(agent.path)])
    steps.say(
        f"\ncapsuled ({capsuled}) runs now and at every login. Check it with:\n"
        "    capsulectl ping\n"
        f"    launchctl print {target}"
    )
    return EXIT_OK


def _launchd_uninstall(steps: _Steps, socket_path: Path) -> int:
    path = launch_agents_dir() / f"{LAUNCHD_LABEL}.plist"
    launchctl = _launchctl()
    target = f"gui/{os.getuid()}/{LAUNCHD_LABEL}"
    if _loaded(launchctl, target):
        steps.run([launchctl, "bootout", target])
    if os.path.lexists(path):
        kept = _remove_ours(steps, [path])
    else:
        kept = []
        steps.say(f"{path} is not there: nothing to remove")
    _what_stays(steps, socket_path)
    log = Path.home() / "Library" / "Logs" / "capsuled.log"
    if log.exists():
        steps.say(f"  its log: rm {shlex.quote(str(log))}")
    return EXIT_FAILED if kept else EXIT_OK
