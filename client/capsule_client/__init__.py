"""Client library for capsuled: the clients, and beside them the wire types and the writer kit.

>>> from capsule_client import Client
>>> with Client() as client:          # doctest: +SKIP
...     print(client.ping().version)

``Client`` blocks; ``AsyncClient`` is the same for anyio code. Both find the
socket as docs/design.md §2 says and raise the exceptions of
:mod:`capsule_client.errors`. The package's rooms (docs/design.md §1):

* :mod:`capsule_client.wire`: every type that crosses the socket;
* :mod:`capsule_client.kit`: the writer kit for runtimes (paths, receipts,
  the ownership store, the trace, the launcher);
* :mod:`capsule_client.cli`: ``capsulectl``; :mod:`capsule_client.mcp`:
  ``capsulectl mcp``; :mod:`capsule_client.agents`: the agent integrations.

Each name below is imported from its module when first asked for, so that
``capsulectl --version`` pays for none of them and ``import capsule_client``
does not load anyio for ``AsyncClient`` (docs/design.md §9).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .async_client import AsyncClient, AsyncSubscription
    from .client import Client, Subscription
    from .errors import (
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
    from .kit.paths import default_home, default_socket
    from .wire.constants import DEFAULT_TIMEOUT_S

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


def __getattr__(name: str) -> object:
    """A name of ``__all__``, imported from the module that defines it on first use."""
    if name in ("Client", "Subscription"):
        from . import client

        value = getattr(client, name)
    elif name in ("AsyncClient", "AsyncSubscription"):
        from . import async_client

        value = getattr(async_client, name)
    elif name == "DEFAULT_TIMEOUT_S":
        from .wire import constants

        value = constants.DEFAULT_TIMEOUT_S
    elif name in ("default_home", "default_socket"):
        from .kit import paths

        value = getattr(paths, name)
    elif name in __all__:
        from . import errors

        value = getattr(errors, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
