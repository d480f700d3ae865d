"""Generated homes: N receipts in the writer kit's formats, shared by a few real processes.

A home of ``n`` receipts holds about half provider-client receipts (10 per
input, 100 inputs per run) and half exec receipts (one flat
``runtime/exec-processes/`` directory), and an ownership store in which 100
sessions own every input and exec. A live receipt names one of ~50 real
``sleep`` processes with its real start time, so the reader retains it.

A home may also hold *stale* receipts, spread evenly among the live ones (a
realistic home: a few live receipts among many left by processes that are
gone). Half of them name a process that has exited (started, recorded and
reaped when the pool was made), with its real start time; the other half name
a running ``sleep`` of the pool with a start time a day too early (a reused
pid). Both are what the reader must drop as stale.

Receipts are encoded with the writer kit's own structs
(``capsule_client.kit.receipts``), but written without the kit's ``fsync``s and
renames (200,000 ``fsync``s would measure the disk, not the daemon); the
schema is created by the kit's ``OwnershipStore`` and filled in one
transaction for the same reason.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec

__all__ = ["GeneratedHome", "SleepPool", "generate_home", "start_time_s"]

CLIENTS_PER_INPUT = 10
INPUTS_PER_RUN = 100
SESSIONS = 100
#: Processes that exited, named by half of the stale receipts.
EXITED_PROCESSES = 50
#: How much too early the other stale receipts' start times are, seconds.
REUSED_PID_SHIFT_S = 86_400.0


def start_time_s(pid: int) -> float:
    """The start time of ``pid`` as the writer kit reads it from the OS."""
    from capsule_client.kit.receipts import process_start_time

    return process_start_time(pid)


class SleepPool:
    """``count`` real ``sleep`` processes that receipts can name; killed by :meth:`close`.

    Attributes:
        processes: the running ``sleep`` processes.
        starts: their start times, by pid.
        exited: ``(pid, start time)`` of :data:`EXITED_PROCESSES` processes
            that ran and were reaped (with ``exited=True``; else empty).
    """

    def __init__(self, count: int, *, exited: bool = True) -> None:
        self.processes = [
            subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL) for _ in range(count)
        ]
        self.starts = {p.pid: start_time_s(p.pid) for p in self.processes}
        self.exited: list[tuple[int, float]] = []
        if exited:
            gone = [
                subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
                for _ in range(EXITED_PROCESSES)
            ]
            self.exited = [(p.pid, start_time_s(p.pid)) for p in gone]
            for process in gone:
                process.kill()
                process.wait(timeout=10)

    @property
    def pids(self) -> list[int]:
        """The pids, in start order."""
        return [p.pid for p in self.processes]

    def close(self) -> None:
        """Kill and reap every process."""
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait(timeout=10)


@dataclass(frozen=True, slots=True)
class GeneratedHome:
    """A home made by :func:`generate_home`.

    Attributes:
        home: the home directory.
        receipts: receipt files written.
        provider_receipts: of which provider-client receipts.
        exec_receipts: of which exec receipts.
        directories: directories created under the home.
        bytes: receipt bytes written.
        live: of the receipts, those whose process runs (the reader retains them).
    """

    home: Path
    receipts: int
    provider_receipts: int
    exec_receipts: int
    directories: int
    bytes: int
    live: int

    @property
    def stale(self) -> int:
        """Receipts whose process is gone or whose pid was reused."""
        return self.receipts - self.live


def _mkdir(path: Path) -> None:
    path.mkdir(mode=0o700)


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class _Names:
    """Which process receipt ``j`` of ``total`` names: ``live`` of them spread evenly."""

    def __init__(self, pool: SleepPool, live: int, total: int) -> None:
        self.pids = pool.pids
        self.starts = pool.starts
        self.exited = pool.exited
        self.live = live
        self.total = total
        if live < total and not self.exited:
            raise ValueError("stale receipts need a pool made with exited=True")

    def __call__(self, j: int) -> tuple[int, float]:
        if (j * self.live) // self.total != ((j + 1) * self.live) // self.total:
            pid = self.pids[j % len(self.pids)]
            return pid, self.starts[pid]
        if j % 2:
            return self.exited[(j // 2) % len(self.exited)]
        pid = self.pids[(j // 2) % len(self.pids)]
        return pid, self.starts[pid] - REUSED_PID_SHIFT_S


def generate_home(home: Path, n: int, pool: SleepPool, *, stale: int = 0) -> GeneratedHome:
    """Write ``n`` live and ``stale`` stale receipts and their ownership under a new ``home``.

    Raises:
        FileExistsError: ``home`` exists.
    """
    from capsule_client.kit.paths import store_path
    from capsule_client.kit.receipts import ExecReceipt, ProviderClientReceipt
    from capsule_client.kit.store import OwnershipStore

    encode = msgspec.json.Encoder().encode
    total = n + stale
    names = _Names(pool, n, max(total, 1))
    n_provider = total // 2
    n_exec = total - n_provider
    _mkdir(home)
    directories = 0
    written = 0
    inputs: list[str] = []
    runs = home / "runs"
    _mkdir(runs)
    directories += 1
    clients_dir = runs
    for i in range(n_provider):
        if i % (CLIENTS_PER_INPUT * INPUTS_PER_RUN) == 0:
            run_dir = runs / f"run_{i // (CLIENTS_PER_INPUT * INPUTS_PER_RUN):05d}"
            _mkdir(run_dir)
            directories += 1
        if i % CLIENTS_PER_INPUT == 0:
            input_id = f"inp_{i // CLIENTS_PER_INPUT:07d}"
            inputs.append(input_id)
            _mkdir(run_dir / input_id)
            clients_dir = run_dir / input_id / "provider-clients"
            _mkdir(clients_dir)
            directories += 2
        pid, started = names(i)
        receipt = ProviderClientReceipt(
            schema_version=1,
            pid=pid,
            started_at=datetime.fromtimestamp(started, tz=UTC),
            provider="opencode",
        )
        data = encode(receipt)
        _write(clients_dir / f"cli_{i % CLIENTS_PER_INPUT:02d}.json", data)
        written += len(data)
    execs_dir = home / "runtime" / "exec-processes"
    _mkdir(home / "runtime")
    _mkdir(execs_dir)
    directories += 2
    execs: list[str] = []
    for i in range(n_exec):
        exec_id = f"exe_{i:07d}"
        execs.append(exec_id)
        pid, started = names(n_provider + i)
        receipt_e = ExecReceipt(
            schema_version=1,
            exec_id=exec_id,
            pid=pid,
            started_at=round(started),
            command=f"pytest tests/test_{i % 97}.py -q",
        )
        data = encode(receipt_e)
        _write(execs_dir / f"{exec_id}.json", data)
        written += len(data)
    OwnershipStore(store_path(home)).close()  # the kit creates the schema and user_version
    _fill_store(store_path(home), inputs, execs)
    return GeneratedHome(home, total, n_provider, n_exec, directories, written, n)


def _fill_store(path: Path, inputs: list[str], execs: list[str]) -> None:
    with _connect(path) as db:
        db.executemany(
            "INSERT INTO sessions (session_id, context_id, title, created_at) VALUES (?, ?, ?, ?)",
            [
                (f"ses_{s:04d}", f"ctx_{s % 10}", f"session {s}", 1_700_000_000)
                for s in range(SESSIONS)
            ],
        )
        db.executemany(
            "INSERT INTO session_inputs (input_id, session_id) VALUES (?, ?)",
            [(input_id, f"ses_{k % SESSIONS:04d}") for k, input_id in enumerate(inputs)],
        )
        db.executemany(
            "INSERT INTO session_execs (exec_id, session_id) VALUES (?, ?)",
            [(exec_id, f"ses_{k % SESSIONS:04d}") for k, exec_id in enumerate(execs)],
        )


@contextmanager
def _connect(path: Path) -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(path)
    try:
        with db:
            yield db
    finally:
        db.close()
