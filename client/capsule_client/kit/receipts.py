"""Receipt file formats and the writer kit for them (docs/design.md §3, §9).

A *receipt* is a small JSON file a runtime leaves under the home saying that a
process belongs to an input or an exec::

    runs/<run>/<input>/provider-clients/<client>.json   ProviderClientReceipt
    runtime/exec-processes/<exec>.json                  ExecReceipt
    runtime/opencode-servers.json                       list[ServerRegistryEntry]

The daemon decodes receipts with the decoders here, so the format is written
down once. Unknown fields are ignored (forward compatibility); a wrong type, a
missing field, ``schema_version != 1`` or ``pid <= 1`` raise
:class:`ReceiptError`.

Both receipt kinds may carry the process's exact identity, ``boot_id`` and
``start_ticks`` (docs/design.md §3, §14): both or neither, the boot id written
as the kernel writes it. Where both sides have it, the daemon compares it
exactly, and the wall-clock ``started_at`` is then only what people are shown.

The writer half (``write_provider_client_receipt``, ``write_exec_receipt``)
writes a receipt atomically: a hidden ``.name.tmp`` beside it, ``fsync``,
``rename``; directories are created ``0700``. The start is read from the
operating system (:func:`process_start`: the start time, and on Linux the boot
id and start ticks), never taken from the caller's clock, because the daemon
matches it against its own process sample.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Final, TypeVar

import msgspec

from .paths import make_private_dirs
from .proc import ProcessStart, is_boot_id, process_start, process_start_time

__all__ = [
    "EXEC_RECEIPT_TOLERANCE_S",
    "MAX_RECEIPT_BYTES",
    "PROVIDER_CLIENT_TOLERANCE_S",
    "SERVER_TOLERANCE_S",
    "ExecReceipt",
    "ProcessStart",
    "ProviderClientReceipt",
    "ReceiptError",
    "ServerRegistryEntry",
    "decode_exec_receipt",
    "decode_provider_client_receipt",
    "decode_servers_registry",
    "exec_receipt_path",
    "is_valid_input_id",
    "make_private_dirs",
    "process_start",
    "process_start_time",
    "provider_client_receipt_path",
    "write_exec_receipt",
    "write_provider_client_receipt",
]

#: A receipt larger than this is an error for its path (docs/design.md §3).
MAX_RECEIPT_BYTES: Final = 64 * 1024

#: Liveness tolerances between a receipt's ``started_at`` and the sampled
#: process start time, in seconds (docs/design.md §3 "Liveness").
PROVIDER_CLIENT_TOLERANCE_S: Final = 5.0
EXEC_RECEIPT_TOLERANCE_S: Final = 3.0
SERVER_TOLERANCE_S: Final = 3.0

SCHEMA_VERSION: Final = 1

_INPUT_ID = re.compile(r"inp_[A-Za-z0-9_-]{1,128}")

Pid = Annotated[int, msgspec.Meta(gt=1)]
#: A boot id as the kernel writes it (``/proc/sys/kernel/random/boot_id``).
BootId = Annotated[
    str, msgspec.Meta(pattern="^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
]
StartTicks = Annotated[int, msgspec.Meta(ge=0)]
_T = TypeVar("_T")


class ReceiptError(ValueError):
    """A receipt (or a name used to place one) is not valid; the message says why."""


class ProviderClientReceipt(msgspec.Struct, frozen=True, omit_defaults=True):
    """``runs/<run>/<input>/provider-clients/<client>.json`` (docs/design.md §3).

    Attributes:
        schema_version: must be 1.
        pid: the provider client's process id, > 1.
        started_at: the process's start time, RFC 3339 with an offset.
        provider: e.g. ``opencode``, shown to users.
        boot_id: the boot the process started in, as the kernel writes it.
        start_ticks: its ``starttime``, clock ticks since that boot.
    """

    schema_version: int
    pid: Pid
    started_at: Annotated[datetime, msgspec.Meta(tz=True)]
    provider: str | None = None
    boot_id: BootId | None = None
    start_ticks: StartTicks | None = None

    @property
    def started_at_s(self) -> float:
        """``started_at`` as Unix seconds."""
        return self.started_at.timestamp()


class ExecReceipt(msgspec.Struct, frozen=True, omit_defaults=True):
    """``runtime/exec-processes/<exec>.json`` (docs/design.md §3).

    Attributes:
        schema_version: must be 1.
        exec_id: non-empty.
        pid: the exec process's id, > 1.
        started_at: the process's start time, Unix seconds.
        command: shown to users.
        boot_id: the boot the process started in, as the kernel writes it.
        start_ticks: its ``starttime``, clock ticks since that boot.
    """

    schema_version: int
    exec_id: Annotated[str, msgspec.Meta(min_length=1)]
    pid: Pid
    started_at: int
    command: str | None = None
    boot_id: BootId | None = None
    start_ticks: StartTicks | None = None


class ServerRegistryEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One entry of ``runtime/opencode-servers.json`` (docs/design.md §3).

    Attributes:
        opencode_pid: the server's process id, > 1.
        url: where it listens.
        directory: the directory it serves.
        started_at: its start time, Unix seconds; when given, liveness also
            compares it within :data:`SERVER_TOLERANCE_S`.
    """

    opencode_pid: Pid
    url: str | None = None
    directory: str | None = None
    started_at: int | None = None


_provider_decoder = msgspec.json.Decoder(ProviderClientReceipt)
_exec_decoder = msgspec.json.Decoder(ExecReceipt)
_servers_decoder = msgspec.json.Decoder(list[ServerRegistryEntry])
_encoder = msgspec.json.Encoder()


def _decode(decoder: msgspec.json.Decoder[_T], data: bytes, what: str) -> _T:
    """Decode ``data`` as JSON text; any way it is not one is a :class:`ReceiptError`.

    msgspec does not check the UTF-8 of members it skips (unknown fields),
    and it recurses into nested arrays and objects, raising ``RecursionError``
    past Python's limit: both are checked here, so that every malformed file
    is an error for its path and never an exception out of the reader.
    """
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReceiptError(f"invalid {what}: not UTF-8 at byte {exc.start}") from None
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ReceiptError(f"invalid {what}: {exc}") from exc
    except RecursionError:
        raise ReceiptError(f"invalid {what}: nested too deeply") from None


def _check(receipt: ProviderClientReceipt | ExecReceipt) -> None:
    version = receipt.schema_version
    if version != SCHEMA_VERSION:
        newer = (
            ": newer than this capsuled reads, a newer runtime wrote it; upgrade capsuled"
            if version > SCHEMA_VERSION
            else ""
        )
        raise ReceiptError(
            f"unsupported schema_version {version} (expected {SCHEMA_VERSION}){newer}"
        )
    if (receipt.boot_id is None) != (receipt.start_ticks is None):
        raise ReceiptError(
            "boot_id and start_ticks go together: one without the other names no process"
        )


def decode_provider_client_receipt(data: bytes) -> ProviderClientReceipt:
    """Decode a provider-client receipt.

    Raises:
        ReceiptError: not JSON, a wrong or missing field, ``schema_version``
            other than 1, ``pid <= 1``, ``started_at`` without an offset, a
            ``boot_id`` not written as the kernel writes one, or only one of
            ``boot_id`` and ``start_ticks``.
    """
    receipt = _decode(_provider_decoder, data, "provider-client receipt")
    _check(receipt)
    return receipt


def decode_exec_receipt(data: bytes) -> ExecReceipt:
    """Decode an exec receipt.

    Raises:
        ReceiptError: not JSON, a wrong or missing field, ``schema_version``
            other than 1, ``pid <= 1``, an empty ``exec_id``, a ``boot_id``
            not written as the kernel writes one, or only one of ``boot_id``
            and ``start_ticks``.
    """
    receipt = _decode(_exec_decoder, data, "exec receipt")
    _check(receipt)
    return receipt


def decode_servers_registry(data: bytes) -> list[ServerRegistryEntry]:
    """Decode the servers registry, a JSON array of entries.

    Raises:
        ReceiptError: not a JSON array of valid entries.
    """
    return _decode(_servers_decoder, data, "servers registry")


def is_valid_input_id(name: str) -> bool:
    """An input id: ``inp_`` + 1-128 of ``[A-Za-z0-9_-]`` (docs/design.md §3)."""
    return _INPUT_ID.fullmatch(name) is not None


def _check_file_name(what: str, name: str) -> None:
    if (
        not name
        or name.startswith(".")
        or len(name) > 200
        or any(c in name for c in "/\\\0")
        or name in (".", "..")
    ):
        raise ReceiptError(f"{what} {name!r} cannot be used as a file name")


def provider_client_receipt_path(home: Path, run_id: str, input_id: str, client_id: str) -> Path:
    """Where the provider-client receipt of ``client_id`` goes.

    Raises:
        ReceiptError: ``input_id`` is not an input id, or a name is empty,
            hidden or contains a path separator.
    """
    _check_file_name("run id", run_id)
    _check_file_name("client id", client_id)
    if not is_valid_input_id(input_id):
        raise ReceiptError(f"input id {input_id!r} is not inp_ followed by 1-128 of [A-Za-z0-9_-]")
    return home / "runs" / run_id / input_id / "provider-clients" / f"{client_id}.json"


def exec_receipt_path(home: Path, exec_id: str) -> Path:
    """Where the exec receipt of ``exec_id`` goes.

    Raises:
        ReceiptError: ``exec_id`` is empty, hidden or contains a path separator.
    """
    _check_file_name("exec id", exec_id)
    return home / "runtime" / "exec-processes" / f"{exec_id}.json"


def write_provider_client_receipt(
    home: Path,
    run_id: str,
    input_id: str,
    client_id: str,
    pid: int,
    *,
    provider: str | None = None,
    started_at_s: float | None = None,
    start: ProcessStart | None = None,
) -> Path:
    """Write the provider-client receipt of a running process, atomically.

    Args:
        home: the capsule home.
        run_id: the ``<run>`` directory name.
        input_id: the ``<input>`` directory name, an input id.
        client_id: the receipt's file name without ``.json``.
        pid: the provider client's process id.
        provider: shown to users, e.g. ``opencode``.
        started_at_s: the process's start time, recorded alone (no boot id or
            ticks: the daemon then compares it within the tolerance).
        start: the process's start as :func:`process_start` reads it. When
            neither is given, it is read from the OS now.

    Returns:
        The receipt's path.

    Raises:
        ReceiptError: a name is invalid, ``pid <= 1``, both ``started_at_s``
            and ``start`` are given, or ``start`` has only one of its boot id
            and ticks.
        ProcessLookupError: no process ``pid`` (when the start is read from the OS).
        OSError: writing failed.
    """
    path = provider_client_receipt_path(home, run_id, input_id, client_id)
    recorded = _start(pid, started_at_s, start)
    receipt = ProviderClientReceipt(
        schema_version=SCHEMA_VERSION,
        pid=_check_pid(pid),
        started_at=datetime.fromtimestamp(recorded.started_at_s, tz=UTC),
        provider=provider,
        boot_id=recorded.boot_id,
        start_ticks=recorded.start_ticks,
    )
    _write_atomically(path, _encoder.encode(receipt))
    return path


def write_exec_receipt(
    home: Path,
    exec_id: str,
    pid: int,
    *,
    command: str | None = None,
    started_at_s: float | None = None,
    start: ProcessStart | None = None,
) -> Path:
    """Write the exec receipt of a running process, atomically.

    Args:
        home: the capsule home.
        exec_id: the exec's id; also the receipt's file name without ``.json``.
        pid: the exec process's id.
        command: shown to users.
        started_at_s: the process's start time, recorded alone (no boot id or
            ticks: the daemon then compares it within the tolerance).
        start: the process's start as :func:`process_start` reads it. When
            neither is given, it is read from the OS now.

    Returns:
        The receipt's path.

    Raises:
        ReceiptError: ``exec_id`` is not usable as a file name, ``pid <= 1``,
            both ``started_at_s`` and ``start`` are given, or ``start`` has
            only one of its boot id and ticks.
        ProcessLookupError: no process ``pid`` (when the start is read from the OS).
        OSError: writing failed.
    """
    path = exec_receipt_path(home, exec_id)
    recorded = _start(pid, started_at_s, start)
    receipt = ExecReceipt(
        schema_version=SCHEMA_VERSION,
        exec_id=exec_id,
        pid=_check_pid(pid),
        started_at=round(recorded.started_at_s),
        command=command,
        boot_id=recorded.boot_id,
        start_ticks=recorded.start_ticks,
    )
    _write_atomically(path, _encoder.encode(receipt))
    return path


def _start(pid: int, started_at_s: float | None, start: ProcessStart | None) -> ProcessStart:
    """What a writer records: ``start``, ``started_at_s`` alone, or the OS's reading now."""
    if start is not None:
        if started_at_s is not None:
            raise ReceiptError("give started_at_s or start, not both")
        if (start.boot_id is None) != (start.start_ticks is None):
            raise ReceiptError("a start's boot_id and start_ticks go together")
        if start.boot_id is not None and not is_boot_id(start.boot_id):
            raise ReceiptError(f"boot_id {start.boot_id!r} is not written as the kernel writes one")
        return start
    if started_at_s is not None:
        return ProcessStart(started_at_s)
    return process_start(pid)


def _check_pid(pid: int) -> int:
    if pid <= 1:
        raise ReceiptError(f"pid must be > 1, not {pid}")
    return pid


def _write_atomically(path: Path, data: bytes) -> None:
    """Hidden temp file beside ``path``, fsync, rename, fsync the directory."""
    make_private_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as file:
            file.write(data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
