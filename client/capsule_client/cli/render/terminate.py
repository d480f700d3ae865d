"""``capsulectl terminate``'s report for people: the counts, then each process and its
outcome, descendants under their parents (docs/design.md §7)."""

from __future__ import annotations

from ...text import one_line
from ...wire import TerminatedProcess, TerminateReport
from .tree import cut, shown, tree

__all__ = ["render_terminate"]


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
        f"{counts[o]} {o}" for o in ("exited", "killed", "gone", "refused", "spared") if o in counts
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
