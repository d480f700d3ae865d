"""`capsulectl terminate`: end a session's processes, show each outcome (docs/design.md §7)."""

from __future__ import annotations

import argparse
from typing import TextIO

from . import _core
from ._client import Client
from ._render_tree import cut, shown, terminal_width, tree, wide_argument
from ._text import one_line
from .protocol import TerminatedProcess, TerminateReport, TerminateSignal

__all__ = ["GRACE_MAX_S", "grace_s", "render_terminate", "terminate_arguments", "terminate_command"]

_SIGNALS: tuple[TerminateSignal, ...] = ("TERM", "INT", "HUP", "KILL")
#: The longest ``--grace``: the daemon's bound on ``grace_ms``.
GRACE_MAX_S = 3600.0


def render_terminate(
    report: TerminateReport, *, width: int | None = None, wide: bool = False
) -> str:
    """A ``session.terminate`` report for people: a heading with the counts, one row per
    process with its command line, descendants under their parents (each row cut to
    ``width`` characters; None or ``wide``: whole)."""
    session = one_line(report.session_id)
    if not report.processes:
        return f"session {session}: no process to signal"
    counts: dict[str, int] = {}
    for process in report.processes:
        counts[process.outcome] = counts.get(process.outcome, 0) + 1
    summary = ", ".join(
        f"{counts[o]} {o}" for o in ("exited", "killed", "gone", "refused") if o in counts
    )
    count = len(report.processes)
    heading = (
        f"session {session}: {count} process{'' if count == 1 else 'es'} in "
        f"{report.duration_ms / 1000:.1f} s: {summary}"
    )
    errors = any(isinstance(p.error, str) for p in report.processes)
    rows = [("PID", "KIND", "OUTCOME", *(("ERROR",) if errors else ()), "COMMAND")]
    for row in tree(report.processes):
        listed = row.process
        assert isinstance(listed, TerminatedProcess)
        error = (one_line(listed.error) if isinstance(listed.error, str) else "-",)
        rows.append(
            (
                str(listed.pid),
                listed.kind,
                listed.outcome,
                *(error if errors else ()),
                shown(row),
            )
        )
    columns = len(rows[0]) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    limit = None if wide else width
    lines = [
        cut(
            "  ".join(
                [*(c.ljust(w) for c, w in zip(row[:columns], widths, strict=True)), row[columns]]
            ).rstrip(),
            limit,
        )
        for row in rows
    ]
    return "\n".join([cut(heading, limit), "", *lines])


def _signal(text: str) -> TerminateSignal:
    name = text.upper().removeprefix("SIG")
    for signal in _SIGNALS:
        if signal == name:
            return signal
    raise argparse.ArgumentTypeError(f"must be one of {', '.join(_SIGNALS)}, not {text!r}")


def grace_s(text: str) -> float:
    """``--grace``'s type: seconds within [0, ``GRACE_MAX_S``] (argparse's error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= GRACE_MAX_S:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from 0 to {GRACE_MAX_S:g}, not {text!r}"
        )
    return value


def terminate_arguments(parser: argparse.ArgumentParser) -> None:
    """``SESSION [--signal S] [--grace S]``."""
    parser.add_argument("session_id", metavar="SESSION", help="an active session, ses_...")
    parser.add_argument(
        "--signal",
        type=_signal,
        default="TERM",
        metavar="S",
        help="the first signal: TERM, INT, HUP or KILL (default: TERM)",
    )
    wide_argument(parser)
    parser.add_argument(
        "--grace",
        type=grace_s,
        default=5.0,
        metavar="S",
        help="seconds the processes have to exit before SIGKILL (default: 5)",
    )


def terminate_command(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """Run ``capsulectl terminate``; exit status 0 (errors are raised to ``main``)."""
    if args.json:
        call = _core.terminate(
            args.session_id, signal=args.signal, grace_s=args.grace, commands=True
        )
        raw = client.call_raw(call.method, call.params, min_timeout_s=call.min_timeout_s)
        out.write(raw.decode() + "\n")
        return 0
    report = client.terminate(
        args.session_id, signal=args.signal, grace_s=args.grace, commands=True
    )
    print(render_terminate(report, width=terminal_width(out), wide=args.wide), file=out)
    return 0
