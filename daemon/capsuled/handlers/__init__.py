"""The methods the daemon serves, one handler each (docs/design.md §7).

Each handler takes its decoded params Struct (``capsule_client.wire``)
and returns a result Struct, or raises :class:`~capsuled.errors.RpcError`.
A handler is built from the few things it needs (discovery, the
subscriptions, the records root, the shutdown state), never from the whole
daemon; the supervisor, the composition root, builds them and lists them in
its method table (:func:`method_table`). Blocking work never runs on the
event loop: handlers hand it to worker threads. Handlers that never wait
(``ping``, ``status``) are plain functions, the others coroutines.

Modules: :mod:`.status` (``ping``, ``status``), :mod:`.metrics` (``metrics``), :mod:`.sessions`
(``sessions.*``, ``reader.rescan``), :mod:`.reconcile` (``session.reconcile``),
:mod:`.terminate` (``session.terminate``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from capsule_client.wire import METHOD_PARAMS
from capsuled.rpc.jsonrpc import Method

__all__ = ["method_table"]


def method_table(handlers: Mapping[str, Callable[[Any], Any]]) -> dict[str, Method]:
    """Method name → :class:`~capsuled.rpc.jsonrpc.Method`, each with its params type.

    Raises:
        KeyError: a name that ``capsule_client.wire.METHOD_PARAMS`` does not list.
    """
    return {name: Method(METHOD_PARAMS[name], handler) for name, handler in handlers.items()}
