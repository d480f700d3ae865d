"""The reader package's surface: one job per module, the names other code imports."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import capsuled.reader


def test_all_is_sorted_and_every_name_exists() -> None:
    names = capsuled.reader.__all__
    assert names == sorted(
        names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n)
    )
    for name in names:
        assert hasattr(capsuled.reader, name), name


def test_each_module_says_its_job_and_stays_small() -> None:
    for info in pkgutil.iter_modules(capsuled.reader.__path__):
        module = importlib.import_module(f"capsuled.reader.{info.name}")
        assert module.__doc__ and module.__doc__.strip().splitlines()[0], info.name
        assert module.__file__ is not None
        assert len(Path(module.__file__).read_text().splitlines()) < 500, info.name
