"""Regenerate docs/reliability.md: run the reliability tests at full size, write the figures.

Usage (from the repository root, in the test venv)::

    .venv/bin/python tests/tools/reliability.py          # full size, rewrites docs/reliability.md
    .venv/bin/python tests/tools/reliability.py --ci     # CI size, quick check of the script
    .venv/bin/python tests/tools/reliability.py --list   # the test files it runs

It runs pytest on the reliability tests with ``CAPSULED_HARDENING_FULL=1`` and
``CAPSULED_RELIABILITY_OUT`` set; each test writes what it measured as JSON,
and this script renders those files into the page. A failing test fails the
script and leaves the page as it was.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from capsule_client.wire import METHOD_PARAMS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reliability.md"
NOTES = ROOT / "docs" / "reliability-notes.md"

#: The reliability tests (bad input, load, faults), in the order the page presents them.
TESTS = [
    "tests/integration/protocol/test_fuzz_protocol.py",
    "tests/integration/reliability/test_load.py",
    "tests/integration/reliability/test_faults.py",
    "tests/integration/reconcile/test_bad_input.py",
    "tests/integration/snapshot/test_bad_receipts.py",
    "tests/integration/protocol/test_params_catalogue.py",
    "tests/rpc/test_dispatch_hostile_input.py",
    "tests/reconcile/test_reconcile_scan.py",
    "tests/client/test_receipts.py",
]

INTRO = """\
# Reliability

What the reliability tests show about capsuled under bad input, load and
faults, with the figures of the last full run. Every test here runs in CI at
a small size; the figures below come from the full size.

Regenerate this page (it takes several minutes on two cores):

```
.venv/bin/python tests/tools/reliability.py
```

which runs `pytest` on {tests} with `CAPSULED_HARDENING_FULL=1` and rewrites
this file from what the tests measured. `CAPSULED_FUZZ_EXAMPLES=N` overrides
the number of fuzzing examples. The sections after the measured ones, how
the faults are made and the limits worth knowing, are written by hand in
`docs/reliability-notes.md` and copied in. The kinds of failure these tests
found, each fixed for its kind, are in `docs/history/README.md`.
"""


def _cell(value: Any) -> str:
    """A value whole in one table cell: its pipes escaped, its lines joined, and a
    ``<`` that could open an HTML tag (``<home>``) written as an entity, shown as it is."""
    text = " ".join(str(value).split("\n")).replace("|", "\\|")
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)


def _table(rows: list[tuple[str, Any]]) -> str:
    lines = ["| figure | value |", "| --- | --- |"]
    lines += [f"| {_cell(name)} | {_cell(value)} |" for name, value in rows]
    return "\n".join(lines)


def _methods_fuzzed(fuzzed: list[str]) -> str:
    """The methods fuzzed, counted against every method the daemon serves
    (``capsule_client.wire.METHOD_PARAMS``), naming those the run left out."""
    served = sorted(METHOD_PARAMS)
    left_out = [m for m in served if m not in fuzzed]
    text = f"{len(fuzzed)} of the {len(served)} served: " + ", ".join(f"`{m}`" for m in fuzzed)
    if left_out:
        text += "; not fuzzed in this run: " + ", ".join(f"`{m}`" for m in left_out)
    return text


def _latency_rows(prefix: str, figures: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (f"{prefix}requests", f"{figures['requests']:,}"),
        (f"{prefix}errors", figures["errors"]),
        (f"{prefix}p50", f"{figures['p50_ms']} ms"),
        (f"{prefix}p99", f"{figures['p99_ms']} ms"),
        (f"{prefix}max", f"{figures['max_ms']} ms"),
        (f"{prefix}throughput", f"{figures['requests_per_s']:,} requests/s"),
    ]


def render_fuzz(f: dict[str, Any]) -> str:
    return (
        "## Protocol fuzzing\n\n"
        "`tests/integration/protocol/test_fuzz_protocol.py`: Hypothesis (derandomized, no example "
        "database) writes random bytes, random JSON, requests with every member and every "
        "parameter of every served method of the wrong type, nesting up to 20,000 levels, "
        "huge numbers, invalid UTF-8 and unpaired surrogate escapes, lines of exactly 1 MiB "
        "and 1 MiB + 1, batches of up to 1,000, and a last line without its newline. Each "
        "example is one connection to a real daemon; `tests/models/rpc_model.py`, written from the "
        "specification and sharing no code with the daemon, predicts every reply (code and "
        "id) and every close, and `ping` must answer after each example. The daemon's log "
        "must show no failed connection and no internal error.\n\n"
        + _table(
            [
                ("examples (connections)", f"{f['examples']:,}"),
                ("messages sent", f"{f['messages']:,}"),
                ("reply lines checked", f"{f['replies']:,}"),
                ("documented closes (line over 1 MiB)", f"{f['documented_closes']:,}"),
                ("data sent", f"{f['mib_sent']} MiB"),
                ("methods fuzzed", _methods_fuzzed(f["methods"])),
                ("wall time", f"{f['elapsed_s']} s"),
                ("daemon deaths, unanswered messages", "0"),
            ]
        )
    )


def render_load(f: dict[str, Any]) -> str:
    soft, hard = f["daemon_nofile"]
    return (
        "## Load\n\n"
        f"{f['clients']} concurrent clients (`AsyncClient`, one connection each) x "
        f"{f['requests_per_client']} requests, mixed {', '.join(f['mix'])} in turn"
        + (
            f"; each of the {f['reconciles']:,} reconciles is of a distinct prior session "
            "with one lost work, and each trace ends with exactly one marker afterwards"
            if f.get("reconciles")
            else ""
        )
        + ". The clients run "
        "in one Python process on one event loop beside the daemon on the same two cores, "
        "so the latencies include the clients' own scheduling.\n\n"
        + _table(
            [
                *_latency_rows("", f),
                ("daemon open-file limit (soft / hard)", f"{soft} / {hard}"),
                (
                    "daemon resident memory before / after",
                    " / ".join(f"{m} MiB" for m in f.get("daemon_rss_mib_before_after", [])),
                ),
            ]
        )
        + "\n\n| method | requests | p50 | p99 |\n| --- | --- | --- | --- |\n"
        + "\n".join(
            f"| `{name}` | {m['count']:,} | {m['p50_ms']} ms | {m['p99_ms']} ms |"
            for name, m in f.get("by_method", {}).items()
        )
    )


def render_disturbance(f: dict[str, Any]) -> str:
    return (
        "## A client that never reads, and idle connections\n\n"
        f"{f['clients']} clients x {f['requests_per_client']} pings, measured alone and then "
        f"beside one client that sends requests and never reads (it stuffed "
        f"{f['stuck_client_bytes_sent']:,} bytes before the daemon stopped reading it) and "
        f"{f['idle_connections']} idle connections. The test asserts that the others' p99 "
        "stays within 5 x + 25 ms of the undisturbed p99.\n\n"
        + _table(
            [
                *_latency_rows("alone: ", f["without"]),
                *_latency_rows("disturbed: ", f["with"]),
            ]
        )
    )


def render_stuck_writer(f: dict[str, Any]) -> str:
    return (
        "## A stuck reader is dropped\n\n"
        "With `--write-timeout` set, a connection whose replies are not read is dropped once "
        "a reply has waited that long; meanwhile the others are served.\n\n"
        + _table(
            [
                ("write timeout", f"{f['write_timeout_s']} s (default 10 s)"),
                ("dropped after the client started sending", f"{f['dropped_after_s']} s"),
                ("another client's ping meanwhile", f"{f['others_ping_ms']} ms"),
            ]
        )
    )


def render_generic(name: str, f: dict[str, Any]) -> str:
    title = f.pop("title", name.replace("_", " ").capitalize())
    text = f.pop("text", "")
    rows = [(k.replace("_", " "), v) for k, v in sorted(f.items()) if k != "full"]
    return f"## {title}\n\n" + (text + "\n\n" if text else "") + _table(rows)


RENDERERS = {
    "fuzz": render_fuzz,
    "load": render_load,
    "disturbance": render_disturbance,
    "stuck_writer": render_stuck_writer,
}
ORDER = ["fuzz", "load", "disturbance", "stuck_writer"]


def environment() -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "## Where these figures come from\n\n" + _table(
        [
            ("run", now),
            ("machine", f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs"),
            ("Python", platform.python_version()),
            ("test process open-file limit (soft / hard)", f"{soft} / {hard}"),
        ]
    )


def notes_section(text: str) -> str:
    """docs/reliability-notes.md as the page shows it: from its first section on
    (its own title and the paragraph saying what it is stay behind)."""
    start = text.find("\n## ")
    return text[start:].strip() if start >= 0 else ""


def render(figures: dict[str, dict[str, Any]], notes: str) -> str:
    names = [n for n in ORDER if n in figures] + sorted(set(figures) - set(ORDER))
    sections = [INTRO.format(tests=", ".join(f"`{t}`" for t in TESTS))]
    for name in names:
        renderer = RENDERERS.get(name)
        sections.append(
            renderer(figures[name]) if renderer else render_generic(name, dict(figures[name]))
        )
    if notes:
        sections.append(notes)
    sections.append(environment())
    return "\n\n".join(sections) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="CI sizes; do not rewrite the page")
    parser.add_argument("--list", action="store_true", help="print the test files it runs")
    args = parser.parse_args(argv)
    missing = [t for t in TESTS if not (ROOT / t).exists()]
    if missing:
        print(f"reliability: no such test file: {', '.join(missing)}", file=sys.stderr)
        return 1
    if args.list:
        print("\n".join(TESTS))
        return 0
    with tempfile.TemporaryDirectory(prefix="capsuled-figures-") as out:
        env = {**os.environ, "CAPSULED_RELIABILITY_OUT": out}
        if args.ci:
            env.pop("CAPSULED_HARDENING_FULL", None)
        else:
            env["CAPSULED_HARDENING_FULL"] = "1"
        # A private --basetemp: other pytest runs on the machine clean up the shared one.
        status = subprocess.call(
            [
                *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
                f"--basetemp={out}/pytest",
                *TESTS,
            ],
            cwd=ROOT,
            env=env,
        )
        if status != 0:
            print("reliability: tests failed; docs/reliability.md left as it was", file=sys.stderr)
            return status
        figures = {p.stem: json.loads(p.read_text()) for p in sorted(Path(out).glob("*.json"))}
        if not figures:
            print("reliability: the tests wrote no figures", file=sys.stderr)
            return 1
    page = render(figures, notes_section(NOTES.read_text()))
    if args.ci:
        print(page)
        return 0
    PAGE.write_text(page)
    print(f"reliability: wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
