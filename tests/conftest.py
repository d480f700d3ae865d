from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import DaemonProcess, short_tmpdir


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for sockets (the 107-byte limit) and homes."""
    with short_tmpdir() as path:
        yield path


@pytest.fixture
def daemon(short_dir: Path) -> Iterator[DaemonProcess]:
    """A real capsuled on a fresh home and socket, stopped after the test."""
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with DaemonProcess(home, short_dir / "d.sock") as process:
        yield process
