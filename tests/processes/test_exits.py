"""ExitWatch: a pidfd per watched process, re-checked against pid reuse (processes.exits)."""

from __future__ import annotations

import resource
import subprocess

import anyio
import pytest
from helpers.processes import Sleepers

from capsule_client.kit.proc import ticks_per_s
from capsuled.processes.exits import ExitWatch, pidfds_supported
from capsuled.processes.sample import Start, sample_processes

pytestmark = pytest.mark.skipif(not pidfds_supported(), reason="no pidfd on this system")


def earlier(start: Start, seconds: int) -> Start:
    """The start of a process that started ``seconds`` before ``start``'s."""
    assert start.ticks is not None
    return Start(start.s - seconds, start.ticks - seconds * ticks_per_s())


def _run_watch(
    watched: dict[int, Start],
    during: list[subprocess.Popen[bytes]],
    *,
    max_pidfds: int = 4096,
) -> tuple[int, int, int]:
    """Track ``watched``, kill ``during`` once tracked, and wait for as many exits.

    Returns (exits seen, descriptors held after tracking, processes left unwatched).
    """

    async def main() -> tuple[int, int, int]:
        exited = anyio.Event()
        exits = 0

        def on_exit() -> None:
            nonlocal exits
            exits += 1
            if exits >= len(during):
                exited.set()

        watch = ExitWatch(on_exit, max_pidfds=max_pidfds)
        async with anyio.create_task_group() as tg:
            await tg.start(watch.serve)
            watch.track(watched)
            held, unwatched = watch.held, watch.unwatched
            for process in during:
                process.kill()
            with anyio.fail_after(5):
                if during:
                    await exited.wait()
                else:
                    await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
        assert watch.held == 0  # every descriptor closed on the way out
        return exits, held, unwatched

    return anyio.run(main)


def test_an_exit_is_reported_and_its_descriptor_let_go(pool: Sleepers) -> None:
    keep, doomed = pool.start(), pool.start()
    sample = sample_processes()
    watched = {pid: sample[pid] for pid in (keep.pid, doomed.pid)}
    exits, held, unwatched = _run_watch(watched, [doomed])
    assert (exits, held, unwatched) == (1, 2, 0)


def test_a_reused_pid_counts_as_an_exit_at_once(pool: Sleepers) -> None:
    process = pool.start()
    started = sample_processes()[process.pid]
    # The sample said another process had this pid, 100 s earlier: it is gone.
    exits, held, _ = _run_watch({process.pid: earlier(started, 100)}, [])
    assert (exits, held) == (1, 0)


def test_a_pid_that_no_longer_exists_counts_as_an_exit(pool: Sleepers) -> None:
    process = pool.start()
    started = sample_processes()[process.pid]
    pool.kill(process)
    exits, held, _ = _run_watch({process.pid: started}, [])
    assert (exits, held) == (1, 0)


def test_past_the_limit_exits_are_left_to_sampling(pool: Sleepers) -> None:
    processes = [pool.start() for _ in range(3)]
    sample = sample_processes()
    watched = {p.pid: sample[p.pid] for p in processes}
    exits, held, unwatched = _run_watch(watched, [], max_pidfds=2)
    assert (exits, held, unwatched) == (0, 2, 1)


def test_sampling_mode_holds_nothing(pool: Sleepers) -> None:
    process = pool.start()
    watch = ExitWatch(lambda: None, enabled=False)
    watch.track({process.pid: sample_processes()[process.pid]})
    assert (watch.mode, watch.held) == ("sampling", 0)
    assert watch.notes == ["process exits are noticed by sampling only (no pidfd on this system)"]


def test_a_refused_process_is_reported_once_while_samples_list_it(pool: Sleepers) -> None:
    process = pool.start()
    watched = {process.pid: earlier(sample_processes()[process.pid], 100)}

    async def main() -> tuple[int, int, int]:
        exits: list[None] = []
        watch = ExitWatch(lambda: exits.append(None))
        async with anyio.create_task_group() as tg:
            await tg.start(watch.serve)
            for _ in range(3):  # three observations with the same sample
                watch.track(watched)
            tg.cancel_scope.cancel()
        return len(exits), watch.held, watch.unwatched

    assert anyio.run(main) == (1, 0, 1)


def test_out_of_descriptors_the_processes_are_sampled_not_reported_gone(pool: Sleepers) -> None:
    """docs/design.md §8: a pidfd the daemon cannot open says nothing about the process."""
    processes = [pool.start() for _ in range(2)]
    sample = sample_processes()
    watched = {p.pid: sample[p.pid] for p in processes}

    async def main() -> tuple[list[object], ...]:
        exits: list[None] = []
        watch = ExitWatch(lambda: exits.append(None))
        async with anyio.create_task_group() as tg:
            await tg.start(watch.serve)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))  # no descriptor number left
            try:
                watch.track(watched)
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            short = [watch.mode, watch.held, watch.unwatched, len(exits), watch.notes]
            watch.track(watched)  # descriptors back: the next observation opens them
            back = [watch.mode, watch.held, watch.unwatched, len(exits)]
            tg.cancel_scope.cancel()
        return short, back

    short, back = anyio.run(main)
    assert short[:4] == ["sampling", 0, 2, 0]
    assert "out of file descriptors" in str(short[4])
    assert back == ["pidfd", 2, 0, 0]
