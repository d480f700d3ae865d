"""Running a child in its own Linux user namespace, with its own inotify limits.

Inotify limits are accounted per user namespace (``/proc/sys/user/max_inotify_*``),
so a child in a fresh namespace can be given tiny limits — and meet the real
"watch limit reached" error — without touching the host's settings.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

UNSHARE = ("unshare", "--user", "--map-root-user")


def user_namespaces_work() -> bool:
    """Whether ``unshare --user`` works here and lets the child set its inotify limits."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        [*UNSHARE, "sh", "-c", "test -w /proc/sys/user/max_inotify_watches"],
        capture_output=True,
        check=False,
        timeout=30,
    )
    return probe.returncode == 0


def with_inotify_limit(limit: str, value: int, command: list[str]) -> list[str]:
    """``command`` run in a fresh user namespace where ``/proc/sys/user/<limit>`` is ``value``."""
    shell = f'echo {value} > /proc/sys/user/{limit} && exec "$0" "$@"'
    return [*UNSHARE, "sh", "-c", shell, *command]
