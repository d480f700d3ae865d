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

ROOT = Path(__file__).resolve().parent.parent
SCENARIO_NUMBERS = list(range(1, 19))


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
