"""The naive baseline of scenario 1: every query walks, parses and checks liveness anew.

What a runtime would write without a daemon: walk the two receipt places,
``json.loads`` every receipt, and keep those whose process runs with the
receipt's start time. To keep the baseline honest rather than a straw man it
takes one ``psutil`` process sample per query (not one lookup per receipt),
and it skips what the daemon also does: the ownership query, the projection
into sessions, the stability check and the reply.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import psutil

__all__ = ["naive_live_receipts"]

PROVIDER_TOLERANCE_S = 5.0
EXEC_TOLERANCE_S = 3.0


def _sample() -> dict[int, float]:
    psutil.process_iter.cache_clear()
    sample: dict[int, float] = {}
    for process in psutil.process_iter(["create_time", "status"]):
        info = process.info
        if info["create_time"] is not None and info["status"] != psutil.STATUS_ZOMBIE:
            sample[process.pid] = info["create_time"]
    return sample


def _receipts(directory: str) -> list[str]:
    try:
        return [
            entry.path
            for entry in os.scandir(directory)
            if entry.name.endswith(".json") and not entry.name.startswith(".")
        ]
    except OSError:
        return []


def _subdirectories(directory: str) -> list[str]:
    try:
        return [
            entry.path
            for entry in os.scandir(directory)
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".")
        ]
    except OSError:
        return []


def _live(path: str, sample: dict[int, float], *, provider: bool) -> bool:
    try:
        with open(path, "rb") as file:
            receipt = json.loads(file.read())
        pid = receipt["pid"]
        if provider:
            started = datetime.fromisoformat(receipt["started_at"]).timestamp()
            tolerance = PROVIDER_TOLERANCE_S
        else:
            started = float(receipt["started_at"])
            tolerance = EXEC_TOLERANCE_S
    except (OSError, ValueError, KeyError, TypeError):
        return False
    start = sample.get(pid)
    return start is not None and abs(start - started) <= tolerance


def naive_live_receipts(home: Path) -> int:
    """How many receipts under ``home`` are live, found from scratch."""
    sample = _sample()
    live = 0
    for run in _subdirectories(os.path.join(home, "runs")):
        for input_dir in _subdirectories(run):
            for path in _receipts(os.path.join(input_dir, "provider-clients")):
                live += _live(path, sample, provider=True)
    for path in _receipts(os.path.join(home, "runtime", "exec-processes")):
        live += _live(path, sample, provider=False)
    return live
