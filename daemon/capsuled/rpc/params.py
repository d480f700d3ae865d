"""One method's params, decoded from the request's ``params`` member (docs/design.md §7).

The rules, besides the params Struct's own (``capsule_client.wire``):

* no ``params``, ``"params": null``, ``{}`` and ``[]`` are all "no params";
  other arrays are refused: params are named;
* ``null`` for an optional member is the same as leaving it out (clients of
  several languages send them); ``null`` for a required one is refused;
* a refusal names the parameter at fault and the reason, taking the name
  from the params Struct, never from the client's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, Optional, cast

import msgspec
import msgspec.inspect
from msgspec import UNSET, Raw, Struct, UnsetType

__all__ = ["InvalidParams", "ParamsDecoder"]

_EMPTY: Final = b"{}"
#: Where msgspec says the error is: the member, and the path inside it (``$.spare[0].pid``).
_WHERE: Final = re.compile(r" - at `\$\.([A-Za-z0-9_]+)([^`]*)`$")
_MISSING: Final = re.compile(r"missing required field `([A-Za-z0-9_]+)`")
_UNKNOWN: Final = re.compile(r"Object contains unknown field `")
_keys: Final = msgspec.json.Decoder(dict[str, Raw])


class InvalidParams(Exception):
    """Params that do not fit the method (-32602).

    Attributes:
        data: ``{"param": name, "reason": text}``, the error's ``data`` member.
    """

    def __init__(self, param: str, reason: str, message: str | None = None) -> None:
        super().__init__(message or f"invalid params: {param}: {reason}")
        self.data = {"param": param, "reason": reason}


class ParamsDecoder:
    """Decodes one method's params Struct, once, from the request's ``Raw``.

    msgspec refuses ``null`` for a member typed ``int = 2000``; so when the
    Struct has such members, the params are decoded as a twin Struct whose
    optional members also take ``null`` (same names, constraints and
    defaults), and each ``null`` there is replaced by the member's default.

    Args:
        params: the method's params Struct type.
    """

    def __init__(self, params: type[Struct]) -> None:
        self._type = params
        fields = msgspec.structs.fields(params)
        self._fields = frozenset(f.encode_name for f in fields)
        #: (name, default) of the optional members that refuse null.
        self._defaulted = [
            (f.name, _default_of(f)) for f in fields if not f.required and not _takes_null(f.type)
        ]
        if not self._defaulted:
            self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(params)
            return
        nullable = {name for name, _ in self._defaulted}
        twin = msgspec.defstruct(
            params.__name__,
            [
                (f.name, Optional[f.type] if f.name in nullable else f.type, _twin_field(f))  # noqa: UP045 (built at run time)
                for f in fields
            ],
            forbid_unknown_fields=params.__struct_config__.forbid_unknown_fields,
        )
        self._decoder = msgspec.json.Decoder(twin)

    def decode(self, raw: Raw | UnsetType) -> Any:
        """The params Struct for a request's ``params`` member (``UNSET``: none).

        Raises:
            InvalidParams: they do not fit.
        """
        text = _EMPTY if raw is UNSET else bytes(raw).strip()
        if text == b"null":  # the same as no params
            text = _EMPTY
        elif text[:1] == b"[":
            if text[1:].strip() != b"]":
                raise InvalidParams(
                    "params",
                    "positional params are not supported",
                    "invalid params: params must be an object of named parameters",
                )
            text = _EMPTY
        try:
            decoded = self._decoder.decode(text)
        except RecursionError:
            raise InvalidParams(
                "params", "nested too deeply", "invalid params: nested too deeply"
            ) from None
        except msgspec.ValidationError as exc:
            raise InvalidParams(*self._fault(text, str(exc))) from None
        if not self._defaulted:
            return decoded
        members = msgspec.structs.asdict(decoded)
        for name, default in self._defaulted:
            if members[name] is None:
                members[name] = default()
        return self._type(**members)

    def _fault(self, text: bytes, message: str) -> tuple[str, str]:
        """(param, reason) of a params validation error.

        Field names come from the params Struct, never from parsing a name the
        client sent back out of msgspec's message: a client's key may hold
        backticks or be a megabyte long. An unknown key is found by reading
        the keys in document order, as msgspec does, and cut to 100 characters.
        """
        fields = self._fields
        if _UNKNOWN.match(message):
            try:
                keys = _keys.decode(text)
            except (msgspec.DecodeError, RecursionError):
                keys = {}
            for key in keys:
                if key not in fields:
                    key = key[:100]
                    return key, f"Object contains unknown field `{key}`"
            where = _WHERE.search(message)
            if where and where.group(1) in fields:  # inside a member (``spare``'s objects)
                return where.group(1), "Object contains an unknown field" + where.group(0)
            return "params", "Object contains an unknown field"
        where = _WHERE.search(message)
        reason = _WHERE.sub("", message)
        if where and where.group(1) in fields:  # the path stays when it goes inside the member
            return where.group(1), message if where.group(2) else reason
        missing = _MISSING.search(reason)
        if missing and missing.group(1) in fields:
            return missing.group(1), reason
        return "params", reason[:200]


def _takes_null(type_: Any) -> bool:
    """Whether a member of this type accepts ``null``."""
    info = msgspec.inspect.type_info(type_)
    types = info.types if isinstance(info, msgspec.inspect.UnionType) else (info,)
    return any(isinstance(t, (msgspec.inspect.NoneType, msgspec.inspect.AnyType)) for t in types)


def _default_of(f: msgspec.structs.FieldInfo) -> Callable[[], Any]:
    if f.default is not msgspec.NODEFAULT:
        default = f.default
        return lambda: default
    return cast(Callable[[], Any], f.default_factory)


def _twin_field(f: msgspec.structs.FieldInfo) -> Any:
    """The twin's member: the same wire name and default."""
    if f.required:
        return msgspec.field(name=f.encode_name)
    if f.default is not msgspec.NODEFAULT:
        return msgspec.field(name=f.encode_name, default=f.default)
    return msgspec.field(name=f.encode_name, default_factory=f.default_factory)
