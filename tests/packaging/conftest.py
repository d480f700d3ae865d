"""The packaging tests' fixtures: a copy of the checkout, and the sdist and wheel built
from it once per run (tests/packaging/installs.py has the rest)."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from installs import copy_checkout, run


@pytest.fixture(scope="session")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_checkout(tmp_path_factory.mktemp("checkout"))


@pytest.fixture(scope="session")
def built(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``python -m build``'s sdist and wheel of the checkout, and what it printed."""
    dist = tmp_path_factory.mktemp("dist")
    done = run([sys.executable, "-m", "build", "--outdir", str(dist), str(checkout)])
    assert done.returncode == 0, done.stdout[-5000:]
    return dist, done.stdout


@pytest.fixture
def short_home() -> Iterator[Path]:
    """A user's home with a short path: the default socket, in it, must fit 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="caph", dir="/tmp") as name:
        yield Path(name)
