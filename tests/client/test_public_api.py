"""The curated public surface of the client package (STYLE.md)."""

from __future__ import annotations

import types

import capsule_client
from capsule_client import errors, wire


def isort_order(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions (the order ruff keeps ``__all__`` in)."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_sorted_and_complete() -> None:
    assert capsule_client.__all__ == sorted(capsule_client.__all__, key=isort_order)
    for name in capsule_client.__all__:
        assert hasattr(capsule_client, name), name
    public = {n for n in vars(capsule_client) if not n.startswith("_")}
    # Submodules (client, errors, wire, kit, cli, ...) appear once imported.
    modules = {n for n, v in vars(capsule_client).items() if isinstance(v, types.ModuleType)}
    assert public - modules - {"annotations", "TYPE_CHECKING"} <= set(capsule_client.__all__)


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
        error = errors.error_from_wire(code, "m", {"k": 1})
        assert type(error) is cls and error.code == code and error.data == {"k": 1}
    unknown = errors.error_from_wire(-1, "odd")
    assert type(unknown) is capsule_client.RemoteError and unknown.code == -1


def test_the_wire_names_every_name_of_its_modules_once() -> None:
    assert wire.__all__ == sorted(wire.__all__, key=isort_order)
    for name in wire.__all__:
        assert hasattr(wire, name), name
    defined = [
        name
        for module in (wire.constants, wire.envelope, wire.params, wire.results, wire.status)
        for name in module.__all__
    ]
    assert sorted(defined, key=isort_order) == wire.__all__
