"""The distribution's shape (docs/design.md §1): two packages, two commands, typed, bounded deps."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import pkgutil
import re
import subprocess
import sys

import capsule_client
import capsuled


def test_console_scripts_name_the_two_entry_points() -> None:
    scripts = {
        ep.name: ep.value
        for ep in importlib.metadata.distribution("capsuled").entry_points
        if ep.group == "console_scripts"
    }
    assert scripts == {
        "capsuled": "capsuled.main:main",
        "capsulectl": "capsule_client.cli.main:main",
    }


def test_both_packages_ship_py_typed() -> None:
    for package in (capsuled, capsule_client):
        assert importlib.resources.files(package.__name__).joinpath("py.typed").is_file()


def test_dependencies_have_lower_bounds_and_anyio_is_new_enough() -> None:
    requires = importlib.metadata.requires("capsuled") or []
    runtime = [r for r in requires if "extra ==" not in r]
    assert runtime, requires
    for requirement in runtime:
        assert ">=" in requirement, requirement
    [anyio] = [r for r in runtime if re.match(r"anyio\b", r)]
    floor = re.search(r">=\s*(\d+)\.(\d+)", anyio)
    assert floor and (int(floor.group(1)), int(floor.group(2))) >= (4, 14), anyio
    assert importlib.metadata.metadata("capsuled")["Requires-Python"] == ">=3.11"


def test_the_client_library_does_not_import_prometheus_client() -> None:
    """prometheus_client is the daemon's dependency only: runtimes import the client."""
    modules = [
        info.name
        for info in pkgutil.walk_packages(capsule_client.__path__, "capsule_client.")
        if not info.name.endswith("__main__")
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr
    requires = importlib.metadata.requires("capsuled") or []
    assert any(re.match(r"prometheus[_-]client\b", r) for r in requires), requires


def test_the_daemon_reports_the_installed_version() -> None:
    import capsuled

    assert capsuled.__version__ == importlib.metadata.version("capsuled")
