"""The methods both clients offer, as calls: what each sends and how its result is read.

Each builder (:func:`ping`, :func:`snapshot`, ...) returns a :class:`Call`
without I/O; :func:`blocking` and :func:`awaiting` make it a ``Client`` and an
``AsyncClient`` method with the same signature and docstring. The commands
that send one call themselves (``capsulectl reconcile``, ``terminate``) build
it here too.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Concatenate, Final, Generic, NamedTuple, ParamSpec, Protocol, TypeVar

import msgspec

from .wire.constants import (
    DEFAULT_GRACE_MS,
    DEFAULT_SNAPSHOT_TIMEOUT_MS,
    MAX_PARAM_MS,
    TRACE_LOCK_TIMEOUT_S,
)
from .wire.params import TerminateSignal
from .wire.results import (
    ActiveSessionsSnapshot,
    LostReport,
    PingResult,
    RescanResult,
    SubscribeResult,
    TerminateReport,
    UnsubscribeResult,
)
from .wire.status import MetricsResult, StatusResult

__all__ = [
    "Call",
    "awaiting",
    "blocking",
    "decoder_for",
    "metrics",
    "ping",
    "reconcile",
    "rescan",
    "snapshot",
    "status",
    "subscribe",
    "terminate",
    "unsubscribe",
]

T = TypeVar("T")
P = ParamSpec("P")
M = TypeVar("M", bound=Callable[..., Any])

#: Extra seconds a client waits beyond a server-side ``timeout_ms``.
_SERVER_WAIT_MARGIN_S: Final = 2.0
#: Seconds a reconcile may scan once it holds the trace's lock (a 1 GB trace takes ~2-5 s).
_RECONCILE_SCAN_ALLOWANCE_S: Final = 10.0
#: Seconds a terminate may take beyond its grace: the fresh observation
#: before it, the wait after ``SIGKILL``.
_TERMINATE_ALLOWANCE_S: Final = 10.0


class Call(NamedTuple, Generic[T]):
    """One method call: what to send and how to read the result.

    Attributes:
        method: the JSON-RPC method.
        params: named params, or ``None`` for none.
        result_type: the type the result decodes to.
        min_timeout_s: the least the client must wait (a long poll asks for
            more than the client's default).
    """

    method: str
    params: dict[str, Any] | None
    result_type: Any
    min_timeout_s: float = 0.0

    @property
    def decoder(self) -> msgspec.json.Decoder[Any]:
        """The typed decoder of the result (one per result type, made on first use)."""
        return decoder_for(self.result_type)


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def decoder_for(result_type: Any) -> msgspec.json.Decoder[Any]:
    """The typed decoder of ``result_type``, made on its first use and kept."""
    decoder = _decoders.get(result_type)
    if decoder is None:
        decoder = _decoders[result_type] = msgspec.json.Decoder(result_type)
    return decoder


def ping() -> Call[PingResult]:
    """``ping``: is the daemon there, and which version."""
    return Call("ping", None, PingResult)


def status() -> Call[StatusResult]:
    """``status``: the daemon's state and counters."""
    return Call("status", None, StatusResult)


def snapshot(
    *,
    task: str | None = None,
    timeout_ms: int | None = None,
    max_age_ms: int | None = None,
    since: int | None = None,
    usage: bool = False,
    fresh: bool = False,
    commands: bool = False,
    ports: bool = False,
) -> Call[ActiveSessionsSnapshot]:
    """``sessions.snapshot`` (docs/design.md §7); params as in ``SnapshotParams``.

    Args:
        commands: each process carries ``command``, its argv as the OS
            says it (``None`` where it does not), docs/design.md §5.
        ports: each process carries ``ports``, the sockets it listens on
            (``None`` where the OS does not say), docs/design.md §13.
        fresh: read-your-writes: the answer reflects every receipt, store
            row and process exit completed before the call (``max_age_ms=0``:
            the daemon waits for its watch's barrier, then observes).

    Raises:
        ValueError: ``fresh`` with a ``max_age_ms`` other than 0.
    """
    if fresh:
        if max_age_ms not in (None, 0):
            raise ValueError("fresh=True asks for max_age_ms=0; do not pass another max_age_ms")
        max_age_ms = 0
    params: dict[str, Any] = {}
    for name, value in (
        ("task", task),
        ("timeout_ms", timeout_ms),
        ("max_age_ms", max_age_ms),
        ("since", since),
        ("usage", usage or None),
        ("commands", commands or None),
        ("ports", ports or None),
    ):
        if value is not None:
            params[name] = value
    wait_ms = DEFAULT_SNAPSHOT_TIMEOUT_MS if timeout_ms is None else timeout_ms
    return Call(
        "sessions.snapshot",
        params,
        ActiveSessionsSnapshot,
        min_timeout_s=wait_ms / 1000 + _SERVER_WAIT_MARGIN_S,
    )


def reconcile(from_session: str, this_session: str, context_id: str) -> Call[LostReport | None]:
    """``session.reconcile`` (docs/design.md §6): ``from_session``'s lost work, or ``None``."""
    params = {"from_session": from_session, "this_session": this_session, "context_id": context_id}
    # The daemon may wait this long for the trace's lock, then scan: don't give up first.
    wait_s = TRACE_LOCK_TIMEOUT_S + _RECONCILE_SCAN_ALLOWANCE_S
    return Call("session.reconcile", params, LostReport | None, min_timeout_s=wait_s)


def metrics() -> Call[MetricsResult]:
    """``metrics``: the daemon's figures as OpenMetrics text (docs/design.md §7)."""
    return Call("metrics", None, MetricsResult)


def rescan() -> Call[RescanResult]:
    """``reader.rescan``: the next observation walks the home from scratch."""
    return Call("reader.rescan", None, RescanResult)


def terminate(
    session_id: str,
    *,
    signal: TerminateSignal = "TERM",
    grace_s: float = DEFAULT_GRACE_MS / 1000,
    commands: bool = False,
    spare: Iterable[tuple[int, int]] = (),
    ended_only: bool = False,
) -> Call[TerminateReport]:
    """``session.terminate`` (docs/design.md §7): signal every live process of the
    session, ``SIGKILL`` what is left after ``grace_s`` seconds, report each outcome.

    The call waits the grace out (the client's timeout is raised to cover it).
    ``commands``: each process in the report carries its ``command``.
    ``spare``: (pid, start time in Unix seconds) of processes of the session not
    to signal; the report lists them with the outcome ``spared`` (docs/design.md §11).
    ``ended_only``: only if the session is ended, its leftovers (docs/design.md §13).

    Raises:
        NoSuchSession: the session is not active in the daemon's fresh observation
            (with ``ended_only``, also when it is running: ``data["state"]`` is
            ``"running"``).
        ValueError: ``grace_s`` is outside [0, 3600].
    """
    if not 0 <= grace_s <= MAX_PARAM_MS / 1000:
        raise ValueError(
            f"grace_s must be within [0, {MAX_PARAM_MS / 1000:g}] seconds, not {grace_s!r}"
        )
    grace_ms = round(grace_s * 1000)
    params: dict[str, Any] = {"session_id": session_id, "signal": signal, "grace_ms": grace_ms}
    if commands:
        params["commands"] = True
    spared = [{"pid": pid, "started_at": started_at} for pid, started_at in spare]
    if spared:
        params["spare"] = spared
    if ended_only:
        params["ended_only"] = True
    wait_s = grace_ms / 1000 + _TERMINATE_ALLOWANCE_S
    return Call("session.terminate", params, TerminateReport, min_timeout_s=wait_s)


class _Blocking(Protocol):
    def _call(self, call: Call[T]) -> T: ...


class _Awaiting(Protocol):
    async def _call(self, call: Call[T]) -> T: ...


def blocking(build: Callable[P, Call[T]]) -> Callable[Concatenate[_Blocking, P], T]:
    """``build`` as a method of the blocking client: build the call, send it, return its result."""

    @functools.wraps(build)
    def method(self: _Blocking, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._call(build(*args, **kwargs))

    return _as_method(method, build)


def awaiting(
    build: Callable[P, Call[T]],
) -> Callable[Concatenate[_Awaiting, P], Coroutine[Any, Any, T]]:
    """``build`` as a method of the async client: the same, awaited."""

    @functools.wraps(build)
    async def method(self: _Awaiting, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._call(build(*args, **kwargs))

    return _as_method(method, build)


def _as_method(method: M, build: Callable[..., Any]) -> M:
    """``method`` with ``build``'s signature as ``help()`` shows it: ``self`` first, the
    result in place of its ``Call``."""
    signature = inspect.signature(build)
    result = signature.return_annotation
    if isinstance(result, str) and result.startswith("Call[") and result.endswith("]"):
        result = result[len("Call[") : -1]
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self, *signature.parameters.values()], return_annotation=result
    )
    return method


def subscribe(
    since: int | None, commands: bool = False, *, ports: bool = False
) -> Call[SubscribeResult]:
    params: dict[str, Any] = {}
    if since is not None:
        params["since"] = since
    if commands:
        params["commands"] = True
    if ports:
        params["ports"] = True
    return Call("sessions.subscribe", params or None, SubscribeResult)


def unsubscribe(subscription: str) -> Call[UnsubscribeResult]:
    return Call("sessions.unsubscribe", {"subscription": subscription}, UnsubscribeResult)
