"""A generated trace for measuring the reconcile scan, and its benchmark.

Run the benchmark by hand (the numbers go into docs/reconcile.md)::

    .venv/bin/python tests/reconcile/test_reconcile_bench.py --size-mb 100

Under pytest only a small trace is generated, to check that the generator
says truthfully what a reconcile of it must find.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import msgspec

from capsuled.reconcile.prior_session import reconcile
from capsuled.reconcile.trace_scan import scan_trace

WORDS = "the quick brown fox jumps over a lazy dog build test cargo pytest run src lib".split()


def generate_trace(path: Path, size_bytes: int, *, seed: int = 1) -> list[str]:
    """Write a trace shaped like a runtime's, about ``size_bytes`` long.

    Mostly model output and tool calls (20 to 300 words each), a ``turn_start``
    per 50 lines, a ``shell_detached`` per 100, most of them completed right
    after.  Returns the work ids left unaccounted, sorted.
    """
    rng = random.Random(seed)
    encode = msgspec.json.Encoder().encode
    unaccounted: list[str] = []
    with path.open("wb") as trace:
        trace.write(encode({"event_type": "session_start", "event_id": "evt_s"}) + b"\n")
        trace.write(encode({"event_type": "task_start", "task_id": "tsk_1", "trust": "trusted"}))
        trace.write(b"\n")
        written = 0
        n = 0
        while written < size_bytes:
            n += 1
            common = {"event_id": f"evt_{n}", "session_id": "ses_bench", "timestamp": n}
            if n % 50 == 0:
                event = {"event_type": "turn_start", **common, "turn": n // 50}
            elif n % 100 == 1:
                work_id = f"wrk_{n:09d}"
                event = {
                    "event_type": "shell_detached",
                    **common,
                    "task_id": "tsk_1",
                    "work_id": work_id,
                    "binary": "/bin/sh",
                    "command": " ".join(rng.choices(WORDS, k=5)),
                }
                unaccounted.append(work_id)
            elif n % 100 == 2 and rng.random() < 0.9:
                event = {"event_type": "shell_completed", **common, "work_id": unaccounted.pop()}
            else:
                kind = rng.choice(["model_output", "tool_call", "tool_result"])
                text = " ".join(rng.choices(WORDS, k=rng.randint(20, 300)))
                event = {"event_type": kind, **common, "text": text}
            line = encode(event) + b"\n"
            trace.write(line)
            written += len(line)
    return sorted(unaccounted)


def test_the_generated_trace_reconciles_to_what_the_generator_says(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "ses_bench").mkdir(parents=True)
    trace = root / "ses_bench" / "trace.jsonl"

    expected = generate_trace(trace, 2_000_000)
    scan = scan_trace(trace)
    size = trace.stat().st_size
    report = reconcile(root, "ses_bench", "ses_next", "ctx")

    assert expected, "the generator leaves some work unaccounted"
    assert [d.work.work_id for d in scan.unaccounted()] == expected
    assert scan.bytes == size
    assert report is not None
    assert [work.work_id for work in report.lost] == expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="capsuled-bench-"))
    try:
        root = workdir / "sessions"
        (root / "ses_bench").mkdir(parents=True)
        trace = root / "ses_bench" / "trace.jsonl"
        expected = generate_trace(trace, args.size_mb * 1_000_000)
        size = trace.stat().st_size
        scan_trace(trace)  # warm the page cache
        for _ in range(args.repeat):
            started = time.perf_counter()
            scan = scan_trace(trace)
            elapsed_s = time.perf_counter() - started
            print(
                f"scan_trace: {size / 1e6:.1f} MB, {scan.lines} lines in {elapsed_s:.3f} s"
                f" = {size / 1e6 / elapsed_s:.0f} MB/s"
            )
        started = time.perf_counter()
        report = reconcile(root, "ses_bench", "ses_next", "ctx")
        elapsed_s = time.perf_counter() - started
        assert report is not None and len(report.lost) == len(expected)
        print(
            f"reconcile (scan + {len(expected)} markers, fsync): {elapsed_s:.3f} s"
            f" = {size / 1e6 / elapsed_s:.0f} MB/s"
        )
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
