"""Rendering results: a Markdown document (docs/benchmarks.md), text for the terminal, JSON."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from benchmarks.harness import Result, Table

__all__ = ["render_json", "render_markdown", "render_table", "splice_markdown"]

_COMMAND = "`.venv/bin/python -m benchmarks` (or `make bench`)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(table: Table) -> str:
    """A Markdown table (also readable as plain text)."""
    lines = [
        "| " + " | ".join(_cell(c) for c in table.columns) + " |",
        "| " + " | ".join("---" for _ in table.columns) + " |",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _targets_table(results: Sequence[Result]) -> Table:
    rows = [
        [str(result.scenario.number), verdict.target, verdict.measured, verdict.status]
        for result in results
        for verdict in result.verdicts
    ]
    return Table(columns=["#", "target", "measured", "status"], rows=rows)


def _section(result: Result) -> list[str]:
    scenario = result.scenario
    lines = [
        f"## {scenario.number}. {scenario.title}",
        "",
        f"Baseline in the same run: {scenario.baseline}. Target: {'; '.join(scenario.targets)}.",
        "",
    ]
    if result.outcome is None:
        reason = result.not_measured or f"failed: {result.failure}"
        lines += [render_table(Table(columns=["result"], rows=[[f"not measured: {reason}"]]))]
        return [*lines, ""]
    for table in result.outcome.tables:
        lines += [render_table(table), ""]
    lines += [f"- {note}" for note in result.outcome.notes]
    load = ""
    if result.load_before is not None and result.load_after is not None:
        load = (
            f"; 1-minute load average {result.load_before:.2f} before, "
            f"{result.load_after:.2f} after"
        )
    steal = ""
    if result.steal_percent is not None:
        steal = f"; CPU time stolen by the hypervisor meanwhile {result.steal_percent:.1f} %"
    lines += [f"- Took {result.elapsed_s:.1f} s{load}{steal}.", ""]
    return lines


def render_markdown(
    results: Sequence[Result],
    machine: Sequence[tuple[str, str]],
    *,
    quick: bool,
    judging: Sequence[str] = (),
) -> str:
    """The whole report: how to run, the machine, every target, every scenario.

    ``judging`` is said above the targets table, one item each: how targets are judged.
    """
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    mode = "quick (small sizes: a smoke run, not numbers to steer by)" if quick else "full"
    lines = [
        "# Benchmarks",
        "",
        f"Written by {_COMMAND} on {when}, mode: {mode}. Do not edit by hand: "
        "run the command again.",
        "",
        "Every scenario runs the real daemon (`python -m capsuled`, a separate process) and "
        "its baseline in the same run, on the same machine, one after the other. "
        "`--quick` runs every scenario at small sizes in under a minute (the test suite "
        "runs it so the benchmarks do not rot; it never asserts on speed). "
        "`--only 1,6` runs some scenarios; `--output PATH` writes this page elsewhere; "
        "`--only 1,6 --update PATH` puts their sections into a full page.",
        "",
        "## Machine",
        "",
        render_table(Table(columns=["", ""], rows=[list(row) for row in machine])),
        "",
        "## Targets",
        "",
        *([*(f"- {item}" for item in judging), ""] if judging else []),
        render_table(_targets_table(results)),
        "",
    ]
    for result in results:
        lines += _section(result)
    return "\n".join(lines).rstrip() + "\n"


def _sections(page: str) -> tuple[list[str], dict[int, list[str]]]:
    """A page's lines before its first scenario section, and each section's lines by number."""
    lines = page.rstrip("\n").split("\n")
    head: list[str] = []
    sections: dict[int, list[str]] = {}
    current: list[str] = head
    for line in lines:
        number = line[3:].split(".", 1)[0] if line.startswith("## ") else ""
        if number.isdigit():
            current = sections.setdefault(int(number), [])
        current.append(line)
    return head, sections


def _target_number(line: str) -> int | None:
    cells = line.split("|")
    return int(cells[1]) if len(cells) > 2 and cells[1].strip().isdigit() else None


def _with_rows(head: list[str], rows: dict[int, list[str]]) -> list[str]:
    """``head`` with the target rows of the scenarios in ``rows`` replaced by theirs;
    the rows of a scenario the page has none of yet go in by number."""
    on_page = {n for line in head if (n := _target_number(line)) is not None}
    unplaced = sorted(n for n in rows if n not in on_page)
    out: list[str] = []
    in_targets = False
    for line in head:
        number = _target_number(line)
        if number is not None:
            in_targets = True
            while unplaced and unplaced[0] < number:
                out.extend(rows.pop(unplaced.pop(0)))
        elif in_targets:  # the line after the targets table
            for later in unplaced:
                out.extend(rows.pop(later))
            unplaced, in_targets = [], False
        if number is None or number not in rows:
            out.append(line)
        elif rows[number]:
            out.extend(rows.pop(number))
            rows[number] = []
    for later in unplaced:  # the targets table ended the head
        out.extend(rows.pop(later))
    return out


def splice_markdown(page: str, results: Sequence[Result], when: str, commit: str) -> str:
    """``page`` (a full run's report) with the sections and target rows of ``results``
    replaced by theirs, and a line saying which scenarios were run again, when, on what."""
    fresh_head, fresh = _sections(render_markdown(results, (), quick=False))
    head, sections = _sections(page)
    rows: dict[int, list[str]] = {}
    for line in fresh_head:
        if (number := _target_number(line)) is not None:
            rows.setdefault(number, []).append(line)
    out: list[str] = []
    for line in _with_rows(head, rows):
        out.append(line)
        if line.startswith("Written by "):
            numbers = ", ".join(str(r.scenario.number) for r in results)
            out += [
                "",
                f"Scenario(s) {numbers} run again on {when} (commit {commit}) with "
                "`--only` and spliced into this page (`--update`): their sections say "
                "the load they ran under.",
            ]
    for number in sorted({*sections, *fresh}):
        section = fresh.get(number, sections.get(number, []))
        while section and not section[-1]:
            section = section[:-1]
        out += [*section, ""]
    return "\n".join(out).rstrip() + "\n"


def render_json(
    results: Sequence[Result], machine: Sequence[tuple[str, str]], *, quick: bool
) -> dict[str, Any]:
    """The same content as plain data (for scripts and the smoke test)."""
    return {
        "quick": quick,
        "machine": dict(machine),
        "scenarios": [
            {
                "number": r.scenario.number,
                "title": r.scenario.title,
                "elapsed_s": r.elapsed_s,
                "load_before": r.load_before,
                "load_after": r.load_after,
                "steal_percent": r.steal_percent,
                "not_measured": r.not_measured,
                "failure": r.failure,
                "tables": [
                    {"columns": list(t.columns), "rows": [list(row) for row in t.rows]}
                    for t in (r.outcome.tables if r.outcome else ())
                ],
                "verdicts": [
                    {"target": v.target, "measured": v.measured, "status": v.status}
                    for v in r.verdicts
                ],
            }
            for r in results
        ],
    }
