"""capsuled: the per-user daemon that answers snapshot and reconcile (docs/design.md)."""

#: The distribution's version, written here once: pyproject.toml reads it at build
#: time, so a start of the daemon does not load ``importlib.metadata`` for it.
__version__ = "0.1.0"

__all__ = ["__version__"]
