"""capsuled: the per-user daemon that answers snapshot and reconcile (docs/design.md)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("capsuled")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
