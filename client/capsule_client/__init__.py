"""Client library for capsuled: the clients, the wire types, the writer kit.

>>> from capsule_client import Client
>>> with Client() as client:          # doctest: +SKIP
...     print(client.ping().version)

``Client`` blocks; ``AsyncClient`` is the same for anyio code. Both find the
socket as docs/design.md §2 says and raise the exceptions listed in
``capsule_client._exceptions``. The wire types are in
``capsule_client.protocol``.
"""

import typing as _typing

from ._client import Client, Subscription
from ._core import DEFAULT_TIMEOUT_S
from ._exceptions import (
    CapsuleError,
    ClientClosed,
    ConnectionLost,
    DaemonNotRunning,
    DiscoveryUnavailable,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    NoSuchSession,
    NoSuchTrace,
    Overloaded,
    PermissionDenied,
    ProtocolError,
    RemoteError,
    RequestTimeout,
    ShuttingDown,
    SubscriptionDropped,
    UnsafePath,
)
from .paths import default_home, default_socket

if _typing.TYPE_CHECKING:
    from ._async_client import AsyncClient, AsyncSubscription

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "AsyncClient",
    "AsyncSubscription",
    "CapsuleError",
    "Client",
    "ClientClosed",
    "ConnectionLost",
    "DaemonNotRunning",
    "DiscoveryUnavailable",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "NoSuchSession",
    "NoSuchTrace",
    "Overloaded",
    "PermissionDenied",
    "ProtocolError",
    "RemoteError",
    "RequestTimeout",
    "ShuttingDown",
    "Subscription",
    "SubscriptionDropped",
    "UnsafePath",
    "default_home",
    "default_socket",
]


def __getattr__(name: str) -> _typing.Any:
    """``AsyncClient`` and ``AsyncSubscription`` are imported when first asked for: anyio
    costs every ``capsulectl`` start (and ``capsulectl run``'s fixed cost) its import."""
    if name in ("AsyncClient", "AsyncSubscription"):
        from . import _async_client

        return getattr(_async_client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
