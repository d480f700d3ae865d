from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess, short_tmpdir


@pytest.fixture(scope="module")
def sock() -> Iterator[Path]:
    """The socket of one real capsuled per test module, which must outlive the module's input.

    Module scope: each module that asks for it gets a daemon of its own, started
    on its first test and stopped after its last; the teardown fails the last
    test if the daemon has died meanwhile.
    """
    with short_tmpdir() as tmp:
        home = tmp / "home"
        home.mkdir(mode=0o700)
        with DaemonProcess(home, tmp / "m.sock") as daemon:
            yield daemon.socket_path
            assert daemon.process is not None
            assert daemon.process.poll() is None, "the daemon died of its input"
