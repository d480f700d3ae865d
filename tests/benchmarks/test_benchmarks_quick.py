"""The benchmarks' smoke run: ``python -m benchmarks --quick`` must complete.

It checks that every scenario still runs and yields a table, so the
benchmarks never rot. It never asserts on speed: quick sizes are too small
for numbers to mean anything, and CI machines vary.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_NUMBERS = list(range(1, 22))


@pytest.mark.slow
@pytest.mark.benchmark_smoke
@pytest.mark.timeout(120)
def test_quick_benchmark_run_writes_a_table_for_every_scenario(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    results = tmp_path / "benchmarks.json"

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--quiet",
            "--output",
            str(report),
            "--json",
            str(results),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )

    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    data = json.loads(results.read_text())
    assert data["quick"] is True
    assert [s["number"] for s in data["scenarios"]] == SCENARIO_NUMBERS
    text = report.read_text()
    for scenario in data["scenarios"]:
        assert scenario["failure"] is None
        assert scenario["verdicts"], scenario
        assert all(
            v["status"] in {"met", "MISSED", "reported", "not measured"}
            for v in scenario["verdicts"]
        )
        if scenario["not_measured"] is None:
            assert scenario["tables"] and all(t["rows"] for t in scenario["tables"]), scenario
        assert f"## {scenario['number']}. {scenario['title']}" in text
    assert "## Machine" in text and "## Targets" in text


def test_an_update_replaces_the_sections_and_target_rows_of_the_scenarios_run_only() -> None:
    from benchmarks.harness import Outcome, Result, Scenario, Table, judge
    from benchmarks.report import render_markdown, splice_markdown

    def result(number: int, measured: str) -> Result:
        scenario = Scenario(number, f"scenario {number}", "—", ("t",), lambda ctx: None)  # type: ignore[arg-type, return-value]
        table = Table(columns=["a"], rows=[[measured]])
        return Result(scenario, Outcome([table], [judge("t", measured, True)]), 1.0)

    page = render_markdown([result(1, "old one"), result(2, "old two")], (), quick=False)
    spliced = splice_markdown(page, [result(2, "new two")], "today", "abc")

    assert "old one" in spliced and "new two" in spliced and "old two" not in spliced
    assert spliced.index("## 1.") < spliced.index("## 2.")
    assert "| 2 | t | new two | met |" in spliced
    assert "Scenario(s) 2 run again on today (commit abc)" in spliced


def test_an_update_with_a_scenario_new_to_the_page_adds_its_section_and_rows_in_order() -> None:
    from benchmarks.harness import Outcome, Result, Scenario, Table, judge
    from benchmarks.report import render_markdown, splice_markdown

    def result(number: int, measured: str) -> Result:
        scenario = Scenario(number, f"scenario {number}", "—", ("t",), lambda ctx: None)  # type: ignore[arg-type, return-value]
        table = Table(columns=["a"], rows=[[measured]])
        return Result(scenario, Outcome([table], [judge("t", measured, True)]), 1.0)

    page = render_markdown([result(1, "one"), result(3, "three")], (), quick=False)
    spliced = splice_markdown(page, [result(2, "two"), result(4, "four")], "today", "abc")

    rows = [line for line in spliced.splitlines() if line.startswith("| ") and "| t |" in line]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "2", "3", "4"]
    assert spliced.index("## 1.") < spliced.index("## 2.") < spliced.index("## 3.")
    assert spliced.index("## 3.") < spliced.index("## 4.")
