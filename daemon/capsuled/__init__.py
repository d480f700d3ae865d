"""capsuled: the per-user daemon that answers snapshot and reconcile (docs/design.md)."""

# The distribution's version, written once in the wire's constants: pyproject.toml
# reads it at build time, so a start of the daemon does not load ``importlib.metadata``.
from capsule_client.wire.constants import VERSION as __version__

__all__ = ["__version__"]
