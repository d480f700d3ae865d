"""``capsulectl watch`` and ``top`` wait out a daemon too busy to take them (-32002)."""

from __future__ import annotations

import threading
from pathlib import Path

from helpers.daemon import DaemonProcess
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.cli.render.follow import _snapshot_again, _wait_for_daemon

DEADLINE_S = 5.0


def test_reconnecting_waits_while_the_daemon_is_full_then_answers(short_dir: Path) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with DaemonProcess(home, short_dir / "d.sock", ["--max-connections", "1"]) as daemon:
        holder = Client(daemon.socket_path)
        try:
            holder.status()  # the only slot is taken
            answers: list[int] = []

            def reconnect() -> None:
                with Client(daemon.socket_path) as client:
                    _wait_for_daemon(client)
                    answers.append(_snapshot_again(client).generation)

            waiting = threading.Thread(target=reconnect, daemon=True)
            waiting.start()
            wait_until(
                lambda: "connection refused: too many" in daemon.logs(),
                message="the daemon to refuse the reconnecting client",
            )
            assert waiting.is_alive() and not answers  # refused, it waits instead of failing
        finally:
            holder.close()
        waiting.join(timeout=DEADLINE_S)
        assert not waiting.is_alive(), "no answer after the slot was freed"
        assert len(answers) == 1
