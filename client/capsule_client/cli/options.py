"""The arguments several commands share, and their types (docs/design.md §9)."""

from __future__ import annotations

import argparse

from ..wire.constants import DEFAULT_GRACE_MS, MAX_PARAM_MS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "DEFAULT_GRACE_S",
    "GRACE_MAX_S",
    "grace_s",
    "positive_seconds",
    "wide_argument",
]

#: ``terminate --grace`` and ``run --terminate-on-exit`` without a value: the daemon's default.
DEFAULT_GRACE_S: Final = DEFAULT_GRACE_MS / 1000
#: The longest grace, seconds: the daemon's bound on ``grace_ms``.
GRACE_MAX_S: Final = MAX_PARAM_MS / 1000


def positive_seconds(text: str, max_s: float) -> float:
    """Positive seconds, at most ``max_s`` (else a usage error, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    if value > max_s:
        raise argparse.ArgumentTypeError(f"must be at most {max_s:g} seconds, not {text!r}")
    return value


def grace_s(text: str) -> float:
    """A grace's type: seconds within [0, ``GRACE_MAX_S``] (argparse's error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= GRACE_MAX_S:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from 0 to {GRACE_MAX_S:g}, not {text!r}"
        )
    return value


def wide_argument(parser: argparse.ArgumentParser) -> None:
    """``--wide``: whole command lines, and the receipts' ids and paths."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="whole command lines (not cut to the terminal's width), and each receipt's "
        "exec or input id and path",
    )
