"""The files ``capsulectl service`` writes: the systemd user units and the LaunchAgent,
made from the repository's ``systemd/`` and ``launchd/`` templates (docs/install.md).

The templates ship with the package (``service_templates/`` links to them, so the
repository keeps one copy). A file is written with a line saying which program
wrote it and the SHA-256 of the rest: ``capsulectl service`` replaces or removes
only a file whose rest still has that hash, so a file the user edited, or one
copied by hand, is never overwritten nor deleted (:func:`state_of`).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final
from xml.sax.saxutils import escape

from ..wire.constants import VERSION

__all__ = [
    "LAUNCHD_LABEL",
    "SERVICE_UNIT",
    "SOCKET_UNIT",
    "FileState",
    "ServiceFile",
    "launch_agent",
    "launch_agents_dir",
    "state_of",
    "systemd_exec_path",
    "systemd_units",
    "user_unit_dir",
]

TEMPLATES: Final = Path(__file__).parent / "service_templates"
SOCKET_UNIT: Final = "capsuled.socket"
SERVICE_UNIT: Final = "capsuled.service"
LAUNCHD_LABEL: Final = "dev.capsuled"
#: The line that carries the hash, as it ends a written file's header.
_HASH_LINE: Final = re.compile(r"^.*capsulectl-sha256: ([0-9a-f]{64}).*\n", re.MULTILINE)


class FileState(Enum):
    """What is at a file's path, compared with what ``capsulectl service`` would write."""

    MISSING = "missing"
    #: Exactly what would be written.
    SAME = "same"
    #: Written by ``capsulectl service`` and not edited since, with other content (an
    #: older version of the template, another capsuled): it may be replaced or removed.
    OURS = "ours"
    #: Written by ``capsulectl service``, then edited: kept.
    EDITED = "edited"
    #: Not written by ``capsulectl service`` (copied by hand, a link, not a file): kept.
    FOREIGN = "foreign"


@dataclass(frozen=True, slots=True)
class ServiceFile:
    """A file to write: where, and its whole text (the hash line included)."""

    path: Path
    text: str


def _sealed(header: str, body: str, comment: tuple[str, str]) -> str:
    """``header`` then ``body``, with the hash line of both after ``header``."""
    start, end = comment
    digest = hashlib.sha256((header + body).encode()).hexdigest()
    return f"{header}{start}capsulectl-sha256: {digest}{end}\n{body}"


def state_of(path: Path, text: str) -> FileState:
    """What is at ``path``, against ``text``, what would be written there.

    Never follows a symbolic link: a link is someone else's (FOREIGN).
    """
    try:
        if not path.is_file() or path.is_symlink():
            return FileState.FOREIGN if os.path.lexists(path) else FileState.MISSING
        present = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return FileState.MISSING
    except (OSError, UnicodeDecodeError):
        return FileState.FOREIGN
    if present == text:
        return FileState.SAME
    found = _HASH_LINE.search(present)
    if found is None:
        return FileState.FOREIGN
    rest = present[: found.start()] + present[found.end() :]
    if hashlib.sha256(rest.encode()).hexdigest() != found.group(1):
        return FileState.EDITED
    return FileState.OURS


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def user_unit_dir(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/systemd/user``, else ``~/.config/systemd/user``: where systemd's
    user manager looks for a user's own units (an empty or relative variable is ignored,
    as the XDG base directory specification asks)."""
    env = os.environ if environ is None else environ
    config = env.get("XDG_CONFIG_HOME") or ""
    base = Path(config) if os.path.isabs(config) else Path.home() / ".config"
    return base / "systemd" / "user"


def systemd_exec_path(path: Path) -> str:
    """``path`` as the executable of ``ExecStart=``: ``%`` (a specifier) doubled, quoted
    with C-style escapes when it holds a space, a quote or a backslash
    (systemd.service(5), "Command lines"; variables are not expanded in the executable,
    so ``$`` stays as it is)."""
    text = str(path).replace("%", "%%")
    if re.search(r"[\s\"'\\]", text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _written_by(source: str, edit: str) -> str:
    return (
        f"# Written by `capsulectl service install` (capsuled {VERSION}) from {source};\n"
        "# `capsulectl service uninstall` removes it unless it was edited.\n"
        f"# Change a setting in a drop-in instead: {edit}\n"
    )


def systemd_units(capsuled: Path, unit_dir: Path) -> list[ServiceFile]:
    """The socket and service units for ``unit_dir``, the service's ``ExecStart=`` the
    absolute path ``capsuled`` (no ``ExecSearchPath=``: nothing is looked up)."""
    service = _template(SERVICE_UNIT)
    service, found = re.subn(
        r"(?m)^ExecStart=capsuled$", "ExecStart=" + systemd_exec_path(capsuled), service
    )
    if found != 1:  # pragma: no cover - the template's own test says it has one
        raise ValueError(f"systemd/{SERVICE_UNIT} has no line ExecStart=capsuled")
    service = re.sub(r"(?m)^ExecSearchPath=.*\n", "", service)
    files = []
    for name, body in ((SOCKET_UNIT, _template(SOCKET_UNIT)), (SERVICE_UNIT, service)):
        header = _written_by(f"systemd/{name}", f"systemctl --user edit {name}")
        files.append(ServiceFile(unit_dir / name, _sealed(header, body, ("# ", ""))))
    return files


def launch_agents_dir(home: Path | None = None) -> Path:
    """``~/Library/LaunchAgents``: a user's own launchd agents."""
    return (Path.home() if home is None else home) / "Library" / "LaunchAgents"


def launch_agent(capsuled: Path, home: Path | None = None) -> ServiceFile:
    """The LaunchAgent for ``home`` (default: the user's): ``@HOME@`` replaced, the
    program the absolute path ``capsuled`` instead of ``/usr/bin/env capsuled``."""
    home = Path.home() if home is None else home
    text = _template(f"{LAUNCHD_LABEL}.plist")
    program = "<string>/usr/bin/env</string>\n\t\t<string>capsuled</string>"
    if program not in text:  # pragma: no cover - the template's own test says it is there
        raise ValueError(f"launchd/{LAUNCHD_LABEL}.plist does not run /usr/bin/env capsuled")
    text = text.replace(program, f"<string>{escape(str(capsuled))}</string>")
    text = text.replace("@HOME@", escape(str(home)))
    # The header goes after the XML declaration and the DOCTYPE, which must come first.
    declaration, doctype, body = text.split("\n", 2)
    header = (
        f"{declaration}\n{doctype}\n"
        f"<!-- Written by `capsulectl service install` (capsuled {VERSION}) from "
        f"launchd/{LAUNCHD_LABEL}.plist;\n"
        "     `capsulectl service uninstall` removes it unless it was edited. -->\n"
    )
    path = launch_agents_dir(home) / f"{LAUNCHD_LABEL}.plist"
    return ServiceFile(path, _sealed(header, body, ("<!-- ", " -->")))
