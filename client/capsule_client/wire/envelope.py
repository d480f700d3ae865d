"""The JSON-RPC 2.0 envelope of the capsuled socket (docs/design.md §7).

A request is decoded in two steps, as in msgspec's ``asyncio-kv`` example:
first :class:`Envelope`, whose members are all :class:`msgspec.Raw` so that a
wrong member type can still be answered with the request's ``id``, then the
``params`` with the method's own type (:data:`~capsule_client.wire.params.METHOD_PARAMS`).
"""

# Annotations are objects here, not strings: see the package's docstring.

from typing import Any

from msgspec import UNSET, Raw, Struct, UnsetType

__all__ = [
    "Envelope",
    "ErrorObject",
    "ErrorResponse",
    "Notification",
    "Request",
    "Response",
    "SuccessResponse",
]


class Envelope(Struct):
    """A JSON-RPC request or notification, members left undecoded.

    ``id`` is UNSET for a notification (no ``id`` member) and the raw bytes
    ``null`` for a request whose id is null: the two are answered differently.
    """

    jsonrpc: Raw | UnsetType = UNSET
    method: Raw | UnsetType = UNSET
    params: Raw | UnsetType = UNSET
    id: Raw | UnsetType = UNSET


class Request(Struct, omit_defaults=True):
    """What a client sends; ``params`` is omitted when there are none."""

    jsonrpc: str
    method: str
    id: int | str | None
    params: Any | UnsetType = UNSET


class ErrorObject(Struct, omit_defaults=True):
    """The ``error`` member of a response."""

    code: int
    message: str
    data: Any | UnsetType = UNSET


class SuccessResponse(Struct):
    """``{"jsonrpc": "2.0", "id": ..., "result": ...}``; ``result`` may be null."""

    jsonrpc: str
    id: Raw | None
    result: Any


class ErrorResponse(Struct):
    """``{"jsonrpc": "2.0", "id": ..., "error": {...}}``; ``id`` is null when unknown."""

    jsonrpc: str
    id: Raw | None
    error: ErrorObject


class Response(Struct):
    """What a client decodes: a reply (``result`` or ``error``) or a notification (``method``)."""

    id: int | str | float | None = None
    result: Raw | UnsetType = UNSET
    error: ErrorObject | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET


class Notification(Struct):
    """A notification the daemon sends: no ``id``, never answered."""

    jsonrpc: str
    method: str
    params: Any
