"""The demo runtime leaves a trace that a resumed session reconciles, as the README shows."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.demo import demo_session

from capsule_client.kit.paths import records_root
from capsuled.reconcile.prior_session import reconcile


def test_the_demo_session_reconciles_to_its_two_detached_execs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with demo_session(home) as (printed, _):
        resume = re.search(
            r"^Resume:   \S*capsulectl reconcile (ses_demo_\w+) --as ses_resumed --context (\S+)$",
            printed,
            re.MULTILINE,
        )
        assert resume, printed
        session_id, context_id = resume.groups()
        report = reconcile(records_root(home), session_id, "ses_resumed", context_id)
        assert report is not None
        assert report.started_in_session == session_id
        assert report.context_id == context_id
        assert report.provenance.trust == "trusted"
        assert [work.work_id for work in report.lost] == [
            f"exe_{session_id.removeprefix('ses_')}_build",
            f"exe_{session_id.removeprefix('ses_')}_test",
        ]
        assert {work.binary for work in report.lost} == {"sleep"}
        assert reconcile(records_root(home), session_id, "ses_other", context_id) is None
