"""The curated public surface of the client package (STYLE.md)."""

from __future__ import annotations

import types

import capsule_client
from capsule_client import _exceptions, protocol


def isort_order(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions (the order ruff keeps ``__all__`` in)."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_sorted_and_complete() -> None:
    assert capsule_client.__all__ == sorted(capsule_client.__all__, key=isort_order)
    for name in capsule_client.__all__:
        assert hasattr(capsule_client, name), name
    public = {n for n in vars(capsule_client) if not n.startswith("_")}
    # Submodules (paths, protocol, cli, the writer kit's trace, ...) appear once imported.
    modules = {n for n, v in vars(capsule_client).items() if isinstance(v, types.ModuleType)}
    assert public - modules - {"annotations"} <= set(capsule_client.__all__) | modules


def test_every_wire_error_maps_to_its_class() -> None:
    for code, cls in [
        (-32700, capsule_client.InvalidRequest),
        (-32600, capsule_client.InvalidRequest),
        (-32601, capsule_client.MethodNotFound),
        (-32602, capsule_client.InvalidParams),
        (-32603, capsule_client.InternalError),
        (-32001, capsule_client.DiscoveryUnavailable),
        (-32002, capsule_client.Overloaded),
        (-32003, capsule_client.NoSuchTrace),
        (-32004, capsule_client.UnsafePath),
        (-32005, capsule_client.ShuttingDown),
        (-32006, capsule_client.PermissionDenied),
        (-32007, capsule_client.NoSuchSession),
    ]:
        error = _exceptions.error_from_wire(code, "m", {"k": 1})
        assert type(error) is cls and error.code == code and error.data == {"k": 1}
    unknown = _exceptions.error_from_wire(-1, "odd")
    assert type(unknown) is capsule_client.RemoteError and unknown.code == -1


def test_protocol_all_names_exist() -> None:
    assert protocol.__all__ == sorted(protocol.__all__, key=isort_order)
    for name in protocol.__all__:
        assert hasattr(protocol, name), name
