"""A home with an in-process reader, its change feed, the ownership store and real sleepers."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt, write_provider_client_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot
from capsuled.reader import ActiveSessionReader
from capsuled.reader.store import Ownership, OwnershipReader
from capsuled.watch.changes import ChangeFeed
from helpers.processes import Sleepers


def make_home(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    os.chmod(path, 0o700)
    return path


class World:
    """A home with a reader, a change feed, the ownership store and real sleepers."""

    def __init__(self, home: Path, pool: Sleepers) -> None:
        self.home = make_home(home)
        self.pool = pool
        self.feed = ChangeFeed()
        self.reader = ActiveSessionReader(self.home, self.feed)
        self.store_path = store_path(self.home)

    def store(self) -> OwnershipStore:
        return OwnershipStore(self.store_path)

    def own(
        self,
        session_id: str,
        *,
        inputs: Iterable[str] = (),
        execs: Iterable[str] = (),
        pids: Iterable[int] = (),
        context_id: str | None = None,
    ) -> None:
        """Register a session and what it owns, as a runtime would."""
        with self.store() as store:
            store.register_session(session_id, context_id=context_id)
            for input_id in inputs:
                store.register_input(input_id, session_id)
            for exec_id in execs:
                store.register_exec(exec_id, session_id)
            for pid in pids:
                store.register_process(pid, session_id)

    def exec_receipt(
        self,
        exec_id: str,
        pid: int,
        *,
        command: str | None = None,
        started_at_s: float | None = None,
    ) -> Path:
        return write_exec_receipt(
            self.home, exec_id, pid, command=command, started_at_s=started_at_s
        )

    def client_receipt(
        self,
        input_id: str,
        pid: int,
        *,
        run: str = "run1",
        client: str = "c1",
        provider: str | None = None,
        started_at_s: float | None = None,
    ) -> Path:
        return write_provider_client_receipt(
            self.home, run, input_id, client, pid, provider=provider, started_at_s=started_at_s
        )

    def observe(self) -> ActiveSessionsSnapshot:
        observation = self.reader.observe()
        assert not observation.home_replaced
        return observation.snapshot

    def ready(self) -> ActiveSessionsSnapshot:
        snapshot = self.observe()
        assert snapshot.discovery == "ready", snapshot.gaps
        return snapshot


def pids(snapshot: ActiveSessionsSnapshot) -> dict[str, list[tuple[str, int]]]:
    """session id (or "unowned") -> [(kind, pid)] of a snapshot."""
    out = {s.session_id: [(p.kind, p.pid) for p in s.processes] for s in snapshot.sessions}
    if snapshot.unowned:
        out["unowned"] = [(p.kind, p.pid) for p in snapshot.unowned]
    return out


class CheckHook(threading.Event):
    """A cancel event that runs ``action`` at its ``n``-th check by the reader.

    The reader checks its cancel event before every directory listing and file
    read, so this lets a test act between two reads of a real observation.
    """

    def __init__(self, n: int, action: Callable[[], None]) -> None:
        super().__init__()
        self.n = n
        self.action = action
        self.checks = 0

    def is_set(self) -> bool:
        self.checks += 1
        if self.checks == self.n:
            self.action()
        return super().is_set()


class _OwnershipMoving(OwnershipReader):
    """The real store reader; after each answer, :meth:`after_answer` may change the store."""

    def __init__(self, world: World) -> None:
        super().__init__(world.store_path)
        self.world = world
        self.calls = 0

    def session_process_ownership(
        self, inputs: Iterable[str], execs: Iterable[str], pids: Iterable[int] | None
    ) -> Ownership:
        answer = super().session_process_ownership(inputs, execs, pids)
        self.calls += 1
        self.after_answer()
        return answer

    def after_answer(self) -> None:
        raise NotImplementedError


class OwnershipMovingOnce(_OwnershipMoving):
    """The real store reader; after its first answer a runtime registers an owner."""

    def after_answer(self) -> None:
        if self.calls == 1:
            self.world.own("ses_late", execs=["exe_1"])


class OwnershipMovingAlways(_OwnershipMoving):
    """The real store reader; after each answer a runtime registers one more session.

    Every observation's stability check then finds the store moved: the
    answer stays ``scanning`` however often it is retried.
    """

    def after_answer(self) -> None:
        self.world.own(f"ses_late{self.calls}")
