"""``capsulectl``'s exit statuses (docs/design.md §9); ``run`` adds its own before CMD runs."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

__all__ = ["EXIT_NOT_RUNNING", "EXIT_OK", "EXIT_REMOTE_ERROR", "EXIT_USAGE"]

EXIT_OK: Final = 0
#: The daemon answered an error (or the reply was lost or late).
EXIT_REMOTE_ERROR: Final = 1
#: Bad usage, checked before connecting.
EXIT_USAGE: Final = 2
#: Nothing accepts connections on the socket.
EXIT_NOT_RUNNING: Final = 3
