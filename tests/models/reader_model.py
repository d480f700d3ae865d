"""A reference model of the reader: a home's snapshot, computed slowly and from scratch.

It shares no code with the daemon: it walks the home with ``os.lstat`` /
``os.scandir`` and never follows a symlink, parses receipts with :mod:`json`,
decides liveness from ``/proc/<pid>/stat`` start times (5 s for provider
clients, 3 s for exec receipts and owned processes), reads the store with
:mod:`sqlite3` and projects sessions itself (docs/design.md §2, §3, §5).
:func:`reference` gives what a read-your-writes snapshot of the home must say.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------
# The contract, restated for the reference

PROVIDER_TOLERANCE_S = 5.0
EXEC_TOLERANCE_S = 3.0
PROCESS_TOLERANCE_S = 3.0
MAX_RECEIPT_BYTES = 64 * 1024
INPUT_ID = re.compile(r"inp_[A-Za-z0-9_-]{1,128}")
NOT_LIVE_STATES = frozenset("ZXx")

ProcessKey = tuple[str, int, int, str, str]  # kind, pid, started_at, receipt, input or exec id


# ---------------------------------------------------------------------------
# The reference: processes


def sample_processes() -> dict[int, float]:
    """pid -> start time (Unix seconds) of every process that runs and is not a zombie."""
    with open("/proc/stat", "rb") as file:
        boot_s = next(int(line.split()[1]) for line in file if line.startswith(b"btime "))
    ticks = os.sysconf("SC_CLK_TCK")
    sample: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                data = file.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()
        if fields[0].decode() not in NOT_LIVE_STATES:
            sample[int(name)] = boot_s + int(fields[19]) / ticks
    return sample


# ---------------------------------------------------------------------------
# The reference: receipts


@dataclass(frozen=True)
class Parsed:
    """A receipt that parsed: what liveness and the listing need."""

    pid: int
    start_s: float  # for liveness
    started_at: int  # as listed
    exec_id: str | None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_text(doc: dict[str, Any], name: str) -> bool:
    return name not in doc or isinstance(doc[name], str)


def _parse_provider(doc: dict[str, Any]) -> Parsed | None:
    started = doc.get("started_at")
    if not isinstance(started, str) or not _optional_text(doc, "provider"):
        return None
    try:
        moment = datetime.fromisoformat(started)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    start_s = moment.timestamp()
    return Parsed(doc["pid"], start_s, round(start_s), None)


def _parse_exec(doc: dict[str, Any]) -> Parsed | None:
    exec_id, started = doc.get("exec_id"), doc.get("started_at")
    if not (isinstance(exec_id, str) and exec_id and _is_int(started)):
        return None
    if not _optional_text(doc, "command"):
        return None
    assert isinstance(started, int)
    return Parsed(doc["pid"], float(started), started, exec_id)


def parse_receipt(path: Path, kind: str) -> Parsed | None:
    """The receipt at ``path``, or None when it is broken (an error for its path)."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECEIPT_BYTES:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        data = os.read(fd, MAX_RECEIPT_BYTES + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    version, pid = doc.get("schema_version"), doc.get("pid")
    if not (_is_int(version) and version == 1 and _is_int(pid) and pid > 1):
        return None
    return _parse_provider(doc) if kind == "provider_client" else _parse_exec(doc)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _is_real_dir(path: Path) -> bool:
    st = _lstat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def _names(directory: Path) -> list[str]:
    with os.scandir(directory) as entries:
        return sorted(entry.name for entry in entries if not entry.name.startswith("."))


def receipt_places(home: Path) -> Iterator[tuple[str, Path]]:
    """(kind, directory) of every real receipt directory, reached without a symlink."""
    runs = home / "runs"
    if _is_real_dir(runs):
        for run in _names(runs):
            if not _is_real_dir(runs / run):
                continue
            for input_name in _names(runs / run):
                clients = runs / run / input_name / "provider-clients"
                if _is_real_dir(runs / run / input_name) and _is_real_dir(clients):
                    yield "provider_client", clients
    if _is_real_dir(home / "runtime") and _is_real_dir(home / "runtime" / "exec-processes"):
        yield "exec", home / "runtime" / "exec-processes"


def linked_roots(home: Path) -> set[str]:
    """``runs`` and ``runtime/exec-processes`` when they are symlinks: each is a gap."""
    roots = set()
    for path in (home / "runs", home / "runtime" / "exec-processes"):
        st = _lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode):
            roots.add(str(path))
    return roots


# ---------------------------------------------------------------------------
# The reference: the store and the projection


@dataclass
class Store:
    exists: bool = False
    inputs: dict[str, str] = field(default_factory=dict)
    execs: dict[str, str] = field(default_factory=dict)
    processes: list[tuple[int, int, str]] = field(default_factory=list)
    contexts: dict[str, str | None] = field(default_factory=dict)


def read_store(home: Path) -> Store:
    path = home / "capsule.db"
    if not path.exists():
        return Store()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return Store(
            True,
            dict(db.execute("SELECT input_id, session_id FROM session_inputs")),
            dict(db.execute("SELECT exec_id, session_id FROM session_execs")),
            list(db.execute("SELECT pid, started_at, session_id FROM session_processes")),
            dict(db.execute("SELECT session_id, context_id FROM sessions")),
        )
    finally:
        db.close()


@dataclass
class Expected:
    """What the snapshot must say, and what the reference saw to say it."""

    sessions: dict[str, tuple[str | None, list[ProcessKey]]]
    unowned: list[ProcessKey]
    broken: set[str]
    store_exists: bool
    sample: dict[int, float]
    named_pids: set[int] = field(default_factory=set)
    #: receipt path -> "live", "broken" or "stale", for regular files and the rest
    receipts: dict[Path, str] = field(default_factory=dict)


def reference(home: Path) -> Expected:
    """The snapshot, computed slowly and from scratch."""
    sample = sample_processes()
    store = read_store(home)
    owned: dict[str, list[ProcessKey]] = {}
    expected = Expected({}, [], linked_roots(home), store.exists, sample)
    for kind, directory in receipt_places(home):
        for name in _names(directory):
            if name.endswith(".json"):
                _project_receipt(home, kind, directory / name, store, owned, expected)
    for pid, started_at, session_id in store.processes:
        expected.named_pids.add(pid)
        if pid in sample and abs(sample[pid] - started_at) <= PROCESS_TOLERANCE_S:
            owned.setdefault(session_id, []).append(("process", pid, started_at, "", ""))
    expected.sessions = {
        session_id: (store.contexts.get(session_id), sorted(keys))
        for session_id, keys in owned.items()
    }
    expected.unowned.sort()
    return expected


def _project_receipt(
    home: Path,
    kind: str,
    path: Path,
    store: Store,
    owned: dict[str, list[ProcessKey]],
    expected: Expected,
) -> None:
    parsed = parse_receipt(path, kind)
    if parsed is None:
        expected.broken.add(str(path))
        expected.receipts[path] = "broken"
        return
    expected.named_pids.add(parsed.pid)
    start = expected.sample.get(parsed.pid)
    tolerance_s = PROVIDER_TOLERANCE_S if kind == "provider_client" else EXEC_TOLERANCE_S
    live = start is not None and abs(start - parsed.start_s) <= tolerance_s
    expected.receipts[path] = "live" if live else "stale"
    if not live:
        return
    if kind == "provider_client":
        key = path.parent.parent.name
        if not INPUT_ID.fullmatch(key):
            expected.broken.add(str(path.parent.parent))
            return
        owner = store.inputs.get(key)
    else:
        assert parsed.exec_id is not None
        key = parsed.exec_id
        owner = store.execs.get(key)
    process = (kind, parsed.pid, parsed.started_at, str(path.relative_to(home)), key)
    if owner is None:
        expected.unowned.append(process)
    else:
        owned.setdefault(owner, []).append(process)
