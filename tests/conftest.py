from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess, short_tmpdir
from helpers.listeners import Listeners
from helpers.processes import Processes, Sleepers, sleepers


def pytest_configure(config: pytest.Config) -> None:
    """Children get SIGINT and SIGHUP as a terminal would deliver them.

    A suite started with SIGINT ignored (a background job of a
    non-interactive shell) or SIGHUP ignored (``nohup``) hands the ignoring
    on to every child it starts, and Python leaves an inherited ignore in
    place: the tests that stop ``capsulectl watch`` with Ctrl-C, or a
    ``sleep`` with ``session.terminate``'s HUP, would wait for an exit that
    never comes.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


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


@pytest.fixture
def pool() -> Iterator[Sleepers]:
    """Real ``sleep`` processes, started on demand (``pool.start()``), gone after the test."""
    with sleepers() as started:
        yield started


@pytest.fixture
def procs() -> Iterator[Processes]:
    """Processes the test starts (``procs.sleep()``, ``procs.start(argv)``), killed after it."""
    started = Processes()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def listeners() -> Iterator[Listeners]:
    """Listening children the test starts (``listeners.start(specs)``), killed after it."""
    started = Listeners()
    try:
        yield started
    finally:
        started.close()
