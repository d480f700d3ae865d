"""``capsulectl reconcile``'s report for people: a heading and one row per lost work
(docs/design.md §6)."""

from __future__ import annotations

from ...kit.trace_format import detach_time
from ...text import one_line
from ...wire import LostReport

__all__ = ["render_reconcile"]


def render_reconcile(from_session: str, report: LostReport | None) -> str:
    """A ``session.reconcile`` result for people: a heading and one row per lost work."""
    if report is None:
        return (
            f"Nothing to report: session {from_session} has no background command left "
            "unaccounted (every detached command completed, was abandoned, or was already "
            "reported lost)."
        )
    count = len(report.lost)
    heading = (
        f"Session {report.started_in_session} left {count} background "
        f"command{'' if count == 1 else 's'} unaccounted; now marked lost in its trace.\n"
        f"task {report.task_id}, trust {report.provenance.trust}, context {report.context_id}"
    )
    rows = [("WORK", "DETACHED", "BINARY", "COMMAND")]
    rows.extend(
        (
            one_line(work.work_id),
            detach_time(work.detached_at_ms),
            one_line(work.binary),
            one_line(work.command),
        )
        for work in report.lost
    )
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    table = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
        + "  "
        + row[3]
        for row in rows
    ]
    return "\n".join([heading, "", *table])
