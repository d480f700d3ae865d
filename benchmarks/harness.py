"""What a scenario is, what it returns, and the context it runs in.

A scenario is a function ``run(ctx) -> Outcome`` registered with its number,
title, baseline and target texts (:class:`Scenario`). It measures the daemon
and its baseline in the same run and judges each target with a
:class:`Verdict`. A scenario that cannot run on this tree (a feature has not
landed) raises :class:`NotMeasured`; the report then says why instead of
showing numbers.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import psutil

if TYPE_CHECKING:
    from benchmarks.homes import GeneratedHome, SleepPool
    from benchmarks.watchman import Watchman

__all__ = [
    "ROOT",
    "Context",
    "NotMeasured",
    "Outcome",
    "Result",
    "Scenario",
    "Status",
    "Table",
    "Verdict",
    "cpu_clock",
    "judge",
    "load_average",
    "report",
    "require_modules",
    "steal_percent",
    "whole_process_s",
]

T = TypeVar("T")

#: The repository root: the working directory for ``python -m benchmarks.*`` subprocesses.
ROOT = Path(__file__).resolve().parent.parent

#: Real processes that the generated receipts share.
SHARED_PROCESSES = 50

Status = Literal["met", "MISSED", "reported", "not measured"]


class NotMeasured(Exception):
    """The scenario cannot run on this tree; the message says why."""


@dataclass(frozen=True, slots=True)
class Table:
    """A table of formatted cells; the first column names the row."""

    columns: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One target, what was measured against it, and whether it was met.

    ``reported`` marks a number asked for without a target.
    """

    target: str
    measured: str
    status: Status


def report(target: str, measured: str) -> Verdict:
    """A :class:`Verdict` for a measurement that has no target: ``reported``."""
    return Verdict(target, measured, "reported")


def judge(target: str, measured: str, ok: bool) -> Verdict:
    """A :class:`Verdict` that is ``met`` when ``ok``, else ``MISSED``."""
    return Verdict(target, measured, "met" if ok else "MISSED")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a scenario's ``run`` returns.

    Attributes:
        tables: one or more tables (daemon, baseline and their ratio side by side).
        verdicts: one per target, in the order of :attr:`Scenario.targets`.
        notes: how it was measured, in sentences (shown under the tables).
    """

    tables: Sequence[Table]
    verdicts: Sequence[Verdict]
    notes: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Scenario:
    """A registered benchmark.

    Attributes:
        number: its number in the report (1-based, stable).
        title: what is measured.
        baseline: what it is compared with in the same run ("—" if nothing).
        targets: the targets, as text.
        run: measures and judges; may raise :class:`NotMeasured`.
    """

    number: int
    title: str
    baseline: str
    targets: Sequence[str]
    run: Callable[[Context], Outcome]


@dataclass(frozen=True, slots=True)
class Result:
    """A scenario after it ran: its outcome, or why there is none."""

    scenario: Scenario
    outcome: Outcome | None
    elapsed_s: float
    not_measured: str | None = None
    failure: str | None = None
    load_before: float | None = None
    load_after: float | None = None
    steal_percent: float | None = None

    @property
    def verdicts(self) -> Sequence[Verdict]:
        """The outcome's verdicts, or one ``not measured`` per target."""
        if self.outcome is not None:
            return self.outcome.verdicts
        reason = self.not_measured or f"failed: {self.failure}"
        return [Verdict(t, reason, "not measured") for t in self.scenario.targets]


@dataclass
class Context:
    """What every scenario gets.

    Attributes:
        quick: small sizes (the CI smoke run); numbers are not meaningful.
        workdir: a fresh, short directory (socket paths stay under 107 bytes)
            removed after the run.
        verbose: print progress lines to stderr.
    """

    quick: bool
    workdir: Path
    verbose: bool = True
    resources: ExitStack = field(default_factory=ExitStack)
    _started: float = field(default_factory=time.monotonic)
    _homes: dict[tuple[int, int], GeneratedHome] = field(default_factory=dict)
    _pool: SleepPool | None = None
    _watchman: Watchman | None = None
    _watchman_error: str | None = None

    def sleep_pool(self) -> SleepPool:
        """The ~50 shared ``sleep`` processes receipts name (started once, killed at the end)."""
        if self._pool is None:
            from benchmarks.homes import SleepPool

            self._pool = SleepPool(SHARED_PROCESSES)
            self.resources.callback(self._pool.close)
        return self._pool

    def home(self, receipts: int, *, stale: int = 0) -> GeneratedHome:
        """A generated home of ``receipts`` live and ``stale`` stale receipts, made once and shared.

        Scenarios must not change it for good (scenario 3 changes one receipt's
        content and writes it back the same; scenario 11 adds receipts and
        removes them again).
        """
        key = (receipts, stale)
        if key not in self._homes:
            from benchmarks.homes import generate_home

            what = f"{receipts:,} live" + (f" and {stale:,} stale" if stale else "")
            self.log(f"generating a home of {what} receipts")
            started = time.monotonic()
            name = f"home{receipts}" + (f"s{stale}" if stale else "")
            self._homes[key] = generate_home(
                self.workdir / name, receipts, self.sleep_pool(), stale=stale
            )
            self.log(f"generated in {time.monotonic() - started:.1f} s")
        return self._homes[key]

    def watchman(self) -> Watchman:
        """The run's private watchman server, started once and shut down at the end.

        A full run installs watchman from the distribution if it is missing
        (:func:`benchmarks.watchman.install_watchman`); a quick run does not.

        Raises:
            WatchmanUnavailable: it is missing or does not run (and every
                later call raises it again).
        """
        from benchmarks.watchman import Watchman, WatchmanUnavailable, install_watchman

        if self._watchman is None:
            if self._watchman_error is not None:
                raise WatchmanUnavailable(self._watchman_error)
            try:
                binary = install_watchman(allowed=not self.quick, log=self.log)
                self._watchman = Watchman(binary, self.scratch("watchman"))
            except WatchmanUnavailable as exc:
                self._watchman_error = str(exc)
                self.log(f"no watchman: {exc}; comparing with a bare inotify watch")
                raise
            self.resources.callback(self._watchman.close)
            self.log(f"watchman {self._watchman.version} started (pid {self._watchman.pid})")
        return self._watchman

    def size(self, *, quick: T, full: T) -> T:
        """``quick`` in quick mode, else ``full``."""
        return quick if self.quick else full

    def log(self, message: str) -> None:
        """A progress line on stderr, with the seconds since the run began."""
        if self.verbose:
            elapsed_s = time.monotonic() - self._started
            print(f"[{elapsed_s:7.1f} s] {message}", file=sys.stderr, flush=True)

    def scratch(self, name: str) -> Path:
        """A new directory ``name`` under :attr:`workdir` (mode 0700)."""
        path = self.workdir / name
        path.mkdir(mode=0o700)
        return path


def load_average() -> float | None:
    """The 1-minute load average (other work on the machine skews the numbers)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def whole_process_s(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout_s: float = 60.0,
) -> float:
    """Seconds from the spawn of ``argv`` (``stdin`` written to it) to its exit, which
    must be 0; its output is discarded.

    The exit is waited for with a blocking ``waitpid``, heard at once; a wait with a
    timeout (``subprocess.run(timeout=...)``) polls with growing sleeps and hears an
    exit up to tens of milliseconds late. ``timeout_s`` is enforced by a kill.

    Raises:
        subprocess.CalledProcessError: it exited non-zero (or was killed at the timeout).
    """
    started = time.perf_counter()
    with subprocess.Popen(
        list(argv),
        env=env,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as process:
        killer = threading.Timer(timeout_s, process.kill)
        killer.start()
        try:
            if stdin is not None:
                assert process.stdin is not None
                process.stdin.write(stdin)
                process.stdin.close()
            code = process.wait()
        finally:
            killer.cancel()
        elapsed = time.perf_counter() - started
    if code != 0:
        raise subprocess.CalledProcessError(code, list(argv))
    return elapsed


def cpu_clock() -> tuple[float, float] | None:
    """All CPUs' time so far and the part of it stolen by the hypervisor, in seconds.

    ``None`` where the kernel does not report steal time (not Linux).
    """
    times = psutil.cpu_times()
    steal = getattr(times, "steal", None)
    if steal is None:
        return None
    return float(sum(times)), float(steal)


def steal_percent(
    before: tuple[float, float] | None, after: tuple[float, float] | None
) -> float | None:
    """The share of CPU time stolen between two :func:`cpu_clock` readings, percent.

    On a virtual machine, steal is time a vCPU wanted to run and the host ran
    something else: the same code then takes longer, whatever it is.
    """
    if before is None or after is None or after[0] <= before[0]:
        return None
    return 100 * (after[1] - before[1]) / (after[0] - before[0])


def require_modules(*names: str) -> None:
    """Raise :class:`NotMeasured` unless every module in ``names`` can be imported.

    Raises:
        NotMeasured: naming the first missing module.
    """
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise NotMeasured(f"`{name}` is not in this tree yet")
