"""The active-sessions reader: the receipt cache and ``observe`` (docs/design.md §3-§5).

The package is split by job: :mod:`~capsuled.reader.home` (the home's
identity), :mod:`~capsuled.reader.walk` and :mod:`~capsuled.reader.receipts`
(walking the receipt places, reading receipts),
:mod:`~capsuled.reader.listings` (what each walked directory held),
:mod:`~capsuled.reader.verification` (what the walks saw, compared with what
is there now), :mod:`~capsuled.reader.candidates` (the live receipts and the
pid index), :mod:`~capsuled.reader.ownership` (the store's rows),
:mod:`~capsuled.reader.store` and :mod:`~capsuled.reader.writer_probe` (the
store read-only, and whether a writer's transaction is open),
:mod:`~capsuled.reader.lineage` (the sessions' descendants),
:mod:`~capsuled.reader.projection` (candidates, rows and a process sample
into the answer's lists), :mod:`~capsuled.reader.errors` (the bounded list
of path errors, and why an observation cannot answer),
:mod:`~capsuled.reader.generations` (numbering answers) and
:mod:`~capsuled.reader.observe` (one observation, tying them together).
"""

from __future__ import annotations

from capsuled.home.layout import RACY_WINDOW_NS

from .errors import GAP_TOO_MANY_ERRORS, MAX_ERROR_BYTES, MAX_ERRORS, ObservationCancelled
from .generations import Generations, run_base, same_answer
from .home import GAP_HOME_REPLACED
from .lineage import Lineage
from .observe import GAP_CATCHING_UP, GAP_MOVED, ActiveSessionReader, Observation
from .projection import PROCESS_TOLERANCE_S
from .verification import Verified

__all__ = [
    "GAP_CATCHING_UP",
    "GAP_HOME_REPLACED",
    "GAP_MOVED",
    "GAP_TOO_MANY_ERRORS",
    "MAX_ERRORS",
    "MAX_ERROR_BYTES",
    "PROCESS_TOLERANCE_S",
    "RACY_WINDOW_NS",
    "ActiveSessionReader",
    "Generations",
    "Lineage",
    "Observation",
    "ObservationCancelled",
    "Verified",
    "run_base",
    "same_answer",
]
