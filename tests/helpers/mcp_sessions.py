"""Helpers of the ``capsulectl mcp`` tests: sessions registered as a runtime registers them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import OwnershipStore


def own(home: Path, session_id: str, pids: Sequence[int] = ()) -> None:
    """Register a session (context ``ctx_<id>``) and the processes it owns."""
    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id, context_id=f"ctx_{session_id}")
        for pid in pids:
            store.register_process(pid, session_id)


def exec_of(home: Path, session_id: str, exec_id: str, pid: int, command: str) -> None:
    """``pid`` is an exec of ``session_id`` running ``command``, by its exec receipt."""
    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id, context_id=f"ctx_{session_id}")
        store.register_exec(exec_id, session_id)
    write_exec_receipt(home, exec_id, pid, command=command)


#: A stand-in for a dev server an agent left running: Python that sleeps, with a
#: command line of the kind a model has to read back (a space in an argument).
DEV_SERVER = ["-c", "import time; time.sleep(300)", "--port", "5173", "my app"]
