"""``python -m benchmarks``: run the scenarios, print the tables, write the report.

Exit status: 0 when every selected scenario ran or was "not measured" (a
missed target is a number to steer by, not a failure); 1 when a scenario
crashed; 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.harness import (
    ROOT,
    Context,
    NotMeasured,
    Result,
    Scenario,
    cpu_clock,
    load_average,
    steal_percent,
)
from benchmarks.machine import describe_machine
from benchmarks.report import render_json, render_markdown, render_table, splice_markdown
from benchmarks.scenarios import JUDGING, SCENARIOS, by_number

__all__ = ["main"]

DEFAULT_OUTPUT = ROOT / "docs" / "benchmarks.md"


def _numbers(text: str) -> set[int]:
    try:
        numbers = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,6, not {text!r}") from None
    known = {s.number for s in SCENARIOS}
    if not numbers or not numbers <= known:
        raise argparse.ArgumentTypeError(f"scenarios are numbered {sorted(known)}")
    return numbers


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run capsuled's benchmarks, each against its baseline in the same run.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, under a minute: a smoke run whose numbers mean little",
    )
    parser.add_argument("--only", type=_numbers, metavar="N,N", help="run only these scenarios")
    parser.add_argument(
        "--output",
        type=Path,
        metavar="PATH",
        help=f"write the Markdown report here (default: {DEFAULT_OUTPUT.relative_to(ROOT)} "
        "for a full run of every scenario; none otherwise)",
    )
    parser.add_argument(
        "--update",
        type=Path,
        metavar="PATH",
        help="splice the scenarios run into the full report at PATH (their sections and "
        "target rows; with --only)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def _run_one(scenario: Scenario, ctx: Context) -> Result:
    ctx.log(f"{scenario.number}: {scenario.title}")
    load_before = load_average()
    clock_before = cpu_clock()
    started = time.monotonic()
    outcome = None
    not_measured = failure = None
    try:
        outcome = scenario.run(ctx)
    except NotMeasured as exc:
        ctx.log(f"{scenario.number}: not measured: {exc}")
        not_measured = str(exc)
    except Exception as exc:
        traceback.print_exc()
        failure = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return Result(
        scenario,
        outcome,
        time.monotonic() - started,
        not_measured=not_measured,
        failure=failure,
        load_before=load_before,
        load_after=load_average(),
        steal_percent=steal_percent(clock_before, cpu_clock()),
    )


def _print_result(result: Result) -> None:
    print(f"\n{result.scenario.number}. {result.scenario.title}")
    print(f"   baseline: {result.scenario.baseline}")
    if result.outcome is not None:
        for table in result.outcome.tables:
            print(render_table(table))
    for verdict in result.verdicts:
        print(f"   [{verdict.status}] {verdict.target}: {verdict.measured}")


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; see ``python -m benchmarks --help``."""
    args = _parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so daemons and sleep processes are cleaned up.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    if args.list:
        for scenario in SCENARIOS:
            print(f"{scenario.number}. {scenario.title} (baseline: {scenario.baseline})")
        return 0
    output: Path | None = args.output
    if output is None and not args.quick and args.only is None:
        output = DEFAULT_OUTPUT
    machine = describe_machine(ROOT)  # before the run: the commit that is measured
    workdir = Path(tempfile.mkdtemp(prefix="capb", dir="/tmp"))
    workdir.chmod(0o700)
    ctx = Context(quick=args.quick, workdir=workdir, verbose=not args.quiet)
    try:
        with ctx.resources:
            results = [_run_one(scenario, ctx) for scenario in by_number(args.only)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for result in results:
        _print_result(result)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(
            render_markdown(results, machine, quick=args.quick, judging=JUDGING), encoding="utf-8"
        )
        print(f"\nwrote {output}")
    if args.update is not None:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        commit = dict(machine).get("commit", "?")
        page = args.update.read_text(encoding="utf-8")
        args.update.write_text(splice_markdown(page, results, when, commit), encoding="utf-8")
        print(f"\nupdated {args.update}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(render_json(results, machine, quick=args.quick), indent=2) + "\n",
            encoding="utf-8",
        )
    return 1 if any(r.failure is not None for r in results) else 0
