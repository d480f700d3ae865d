"""``capsulectl terminate --ended``'s output for people: what it would stop (``--dry-run``),
or one report per ended session and a closing count (docs/design.md §13)."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from ...errors import NoSuchSession, RemoteError
from ...text import duration, one_line
from ...wire import Session, SessionProcess, TerminateReport
from .tables import session_state
from .terminate import render_terminate
from .tree import cut, shown, tree

__all__ = ["Outcome", "render_outcomes", "render_plan"]

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one ended session's ``session.terminate`` came to.

    Attributes:
        session: the session as the snapshot listed it.
        report: the daemon's report, when it signalled.
        raw: the report as it came over the wire (``--json``).
        error: the daemon's error, when it answered one.
        running: the error says the session runs again (resumed since the
            snapshot): it was not touched.
    """

    session: Session
    report: TerminateReport | None = None
    raw: bytes | None = None
    error: RemoteError | None = None
    running: bool = False

    @property
    def failed(self) -> bool:
        """Whether something of it may still run: the daemon answered an error other than
        "not ended, or not active any more", or a process was refused or outlived
        ``SIGKILL``."""
        if self.error is not None:
            return not isinstance(self.error, NoSuchSession)
        assert self.report is not None
        return any(
            p.outcome == "refused" or (p.outcome == "killed" and isinstance(p.error, str))
            for p in self.report.processes
        )

    def error_json(self) -> bytes:
        """``{"session_id", "error": {code, message, data}}``: ``--json``'s entry for a
        session whose terminate answered an error."""
        assert self.error is not None
        error = {"code": self.error.code, "message": self.error.message, "data": self.error.data}
        return _encoder.encode({"session_id": self.session.session_id, "error": error})


def _none_left(sessions: list[Session], older_than_s: float | None, now_s: float) -> str:
    """Why there is nothing to stop: no ended session, or none ended long enough ago."""
    ended = [s for s in sessions if s.state == "ended"]
    if not ended:
        return "no ended session: nothing to stop"
    assert older_than_s is not None
    return (
        f"no session ended {duration(older_than_s)} ago or longer: nothing to stop "
        f"({len(ended)} ended more recently, or at a time the daemon did not see)"
    )


def render_plan(
    chosen: list[Session],
    sessions: list[Session],
    older_than_s: float | None,
    now_s: float,
    width: int | None,
) -> str:
    """``--dry-run``: each session that would be terminated, its state and its leftovers."""
    if not chosen:
        return _none_left(sessions, older_than_s, now_s)
    lines: list[str] = []
    for session in chosen:
        lines.append(
            f"would terminate {one_line(session.session_id)} ({session_state(session, now_s)}):"
        )
        for row in tree(session.processes):
            process = row.process
            assert isinstance(process, SessionProcess)
            lines.append(cut(f"  {process.pid:>7}  {process.kind}  {shown(row)}", width))
    count = len(chosen)
    lines.append(f"dry run: {count} ended session{'' if count == 1 else 's'}, nothing stopped")
    return "\n".join(lines)


def render_outcomes(
    outcomes: list[Outcome],
    sessions: list[Session],
    older_than_s: float | None,
    now_s: float,
    width: int | None,
    wide: bool,
) -> str:
    """One report per session (or what the daemon said instead), then the counts."""
    if not outcomes:
        return _none_left(sessions, older_than_s, now_s)
    blocks: list[str] = []
    for outcome in outcomes:
        session = one_line(outcome.session.session_id)
        if outcome.report is not None:
            blocks.append(render_terminate(outcome.report, width=width, wide=wide))
        elif outcome.running:
            blocks.append(f"session {session}: running again, not touched")
        elif isinstance(outcome.error, NoSuchSession):
            blocks.append(f"session {session}: nothing left to stop (its leftovers exited)")
        else:
            assert outcome.error is not None
            blocks.append(
                f"session {session}: terminate failed: error {outcome.error.code}: "
                f"{one_line(outcome.error.message)}"
            )
    failed = sum(o.failed for o in outcomes)
    count = len(outcomes)
    blocks.append(
        f"{count} ended session{'' if count == 1 else 's'}: "
        f"{sum(o.report is not None for o in outcomes)} terminated, "
        f"{sum(o.running for o in outcomes)} running again, {failed} failed"
    )
    return "\n\n".join(blocks)
