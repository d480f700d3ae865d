"""Helpers shared by the reader, store and receipt tests: real processes, real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
from support import wait_until

from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt, write_provider_client_receipt
from capsule_client.kit.store import OwnershipStore
from capsule_client.wire import ActiveSessionsSnapshot
from capsuled.reader import ActiveSessionReader
from capsuled.reader.store import Ownership, OwnershipReader
from capsuled.watch.changes import ChangeFeed

DEADLINE_S = 5.0


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``Z`` for a zombie), None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: read while it is being reaped
        return None
    return data[data.rindex(b")") + 2 :].split()[0].decode()


#: A child that ignores SIGTERM and says so once it does (the handler is set before the line).
IGNORES_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(300)"
)


class Processes:
    """Processes the test started, directly or not: whatever still runs is killed at the end.

    Each is remembered by (pid, create time), so a pid reused since is never killed.
    """

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes]] = []
        self.others: list[psutil.Process] = []

    def start(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
        self.popens.append(process)
        return process

    def sleep(self) -> subprocess.Popen[bytes]:
        process = self.start(["sleep", "300"])
        wait_until(lambda: proc_state(process.pid) == "S", message=f"sleep {process.pid} running")
        return process

    def ignoring_term(self) -> subprocess.Popen[bytes]:
        process = self.start([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE)
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        return process

    def adopt(self, pid: int) -> None:
        """A process the test did not start itself (a grandchild); one already gone is not kept."""
        try:
            self.others.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass

    def close(self) -> None:
        for other in self.others:
            try:
                other.kill()  # psutil checks the create time first
            except psutil.Error:
                pass
        for process in self.popens:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=DEADLINE_S)
            if process.stdout is not None:
                process.stdout.close()


class Sleepers:
    """Starts real ``sleep`` processes and makes sure they are gone afterwards."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(["sleep", "300"])
        self.processes.append(process)
        wait_until(lambda: proc_state(process.pid) == "S", message=f"sleep {process.pid} running")
        return process

    def kill(self, process: subprocess.Popen[bytes], *, reap: bool = True) -> None:
        process.send_signal(signal.SIGKILL)
        if reap:
            process.wait(timeout=DEADLINE_S)
        else:
            wait_until(lambda: proc_state(process.pid) == "Z", message=f"{process.pid} a zombie")

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=DEADLINE_S)


@contextmanager
def sleepers() -> Iterator[Sleepers]:
    pool = Sleepers()
    try:
        yield pool
    finally:
        pool.close()


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
