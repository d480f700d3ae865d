"""Building and installing print no warning of the project's making (docs/install.md),
and the wheel ``python -m build`` makes installs and runs as the checkout does.

A warning of the build backend (setuptools' ``SetuptoolsDeprecationWarning``, which pip
shows as a ``BuildBackendWarning``) is a deprecation the project must fix before it
becomes an error: the license as an SPDX expression, for one. The machine's own lines
(pip's "Location 'file:///…' is ignored" for its configured indexes) are not.
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import pytest
from installs import clean_env, fresh_venv, pip_into, run, serve_and_ping

from capsule_client.wire.constants import VERSION

#: Building and installing from an index take minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: A line that warns: the backend's warnings as pip and build show them, and any
#: line that says "warning" or "deprecat" itself.
WARNING = re.compile(r"warning|deprecat", re.IGNORECASE)
#: The machine's pip configuration, not the project.
MACHINE = re.compile(
    r"^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$"
)
#: setuptools' notice on every editable install of a project with two source roots
#: (daemon/ and client/): informational (``InformationOnly``), never a deprecation.
EDITABLE_NOTICE = "BuildBackendWarning: Editable installation."


def warnings_in(output: str) -> list[str]:
    return [
        line.strip()
        for line in output.splitlines()
        if WARNING.search(line) and not MACHINE.match(line.strip())
    ]


def test_python_m_build_warns_of_nothing(built: tuple[Path, str]) -> None:
    dist, output = built
    assert warnings_in(output) == [], output[-5000:]
    assert sorted(path.name for path in dist.iterdir()) == [
        f"capsuled-{VERSION}-py3-none-any.whl",
        f"capsuled-{VERSION}.tar.gz",
    ]


def test_the_check_finds_a_deprecation_warning() -> None:
    """The check can fail: the backend's deprecation, as pip shows it, is found."""
    sample = (
        "  setuptools/config/_apply_pyprojecttoml.py:82: "
        "SetuptoolsDeprecationWarning: `project.license` as a TOML table is deprecated\n"
        "WARNING: Location 'file:///opt/pypi/simple/x/' is ignored: it is neither a file "
        "nor a directory.\n"
    )
    assert warnings_in(sample) == [sample.splitlines()[0].strip()]


def test_pip_install_warns_of_nothing(checkout: Path, tmp_path: Path) -> None:
    bin_dir = fresh_venv(tmp_path / "venv")
    done = pip_into(bin_dir, str(checkout))
    assert done.returncode == 0, done.stdout[-5000:]
    assert warnings_in(done.stdout) == [], done.stdout[-5000:]


def test_pip_install_editable_warns_of_nothing_but_setuptools_notice(
    checkout: Path, tmp_path: Path
) -> None:
    bin_dir = fresh_venv(tmp_path / "venv")
    done = pip_into(bin_dir, "-e", str(checkout))
    assert done.returncode == 0, done.stdout[-5000:]
    assert "Deprecat" not in done.stdout, done.stdout[-5000:]
    assert [line for line in warnings_in(done.stdout) if EDITABLE_NOTICE not in line] == [], (
        done.stdout[-5000:]
    )
    assert run([str(bin_dir / "capsulectl"), "--version"]).stdout == f"capsulectl {VERSION}\n"


def test_the_wheel_installs_and_runs_and_carries_the_service_templates(
    built: tuple[Path, str], tmp_path: Path
) -> None:
    dist, _ = built
    [wheel] = dist.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for template in ("capsuled.service", "capsuled.socket", "dev.capsuled.plist"):
        assert f"capsule_client/cli/service_templates/{template}" in names
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)
    bin_dir = fresh_venv(tmp_path / "venv")
    done = pip_into(bin_dir, str(wheel))
    assert done.returncode == 0, done.stdout[-5000:]
    assert run([str(bin_dir / "capsuled"), "--version"]).stdout == f"capsuled {VERSION}\n"
    assert run([str(bin_dir / "capsulectl"), "--version"]).stdout == f"capsulectl {VERSION}\n"
    assert f"capsuled {VERSION} is running on" in serve_and_ping(bin_dir)
    # The units name this install's capsuled, made from the templates in the wheel.
    env = clean_env(HOME=str(tmp_path / "user"))
    shown = run([str(bin_dir / "capsulectl"), "service", "install", "--dry-run"], env=env)
    if sys.platform.startswith("linux") and shown.returncode == 0:
        assert f"    ExecStart={bin_dir}/capsuled\n" in shown.stdout
    else:
        assert "systemctl is not installed" in shown.stdout, shown.stdout
