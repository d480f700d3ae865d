"""A description of the machine and software the numbers were measured on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import psutil

__all__ = ["describe_machine"]

PACKAGES = ("capsuled", "anyio", "msgspec", "psutil", "watchfiles", "structlog", "uuid-utils")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _commit(root: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} (with uncommitted changes)" if dirty else head


def describe_machine(root: Path) -> list[tuple[str, str]]:
    """(what, value) pairs: CPU, cores, memory, kernel, Python, packages, commit."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = f"{os.cpu_count()} logical"
    if affinity is not None and affinity != os.cpu_count():
        cores += f" ({affinity} usable)"
    memory_gib = psutil.virtual_memory().total / (1 << 30)
    rows = [
        ("cpu", _cpu_model()),
        ("cores", cores),
        ("memory", f"{memory_gib:.1f} GiB"),
        ("kernel", f"{platform.system()} {platform.release()}"),
        ("python", f"{platform.python_implementation()} {sys.version.split()[0]}"),
        ("packages", ", ".join(f"{name} {_version(name)}" for name in PACKAGES)),
        ("commit", _commit(root)),
    ]
    return rows
