"""Reading one receipt or the servers registry into the candidates and the errors.

A receipt is opened without following symlinks or blocking, checked (a
regular file of the daemon's user, at most 64 KiB), read, parsed and judged
live against the latest sample (docs/design.md §3); a failure is an error
for its path, except the daemon's own shortage (``EMFILE``, ``ENOMEM``...),
which fails the observation (:class:`~capsuled.reader.errors.Shortage`).
A re-check trusts ``lstat`` when the file's signature is unchanged and
stable, and reads it again otherwise.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from typing import Final

from capsule_client.kit.receipts import (
    MAX_RECEIPT_BYTES,
    ReceiptError,
    ServerRegistryEntry,
    decode_exec_receipt,
    decode_provider_client_receipt,
    decode_servers_registry,
)
from capsule_client.wire import DiscoveryCost
from capsuled.home.layout import EXEC_PARTS, SERVERS_PARTS, Kind
from capsuled.processes.sample import ProcessSample

from .candidates import Candidates, Numbers, Receipt, Signature, make_candidate
from .errors import Errors, ObservationCancelled, describe, raise_if_short
from .home import Home

__all__ = ["SYMLINK_NOT_FOLLOWED", "ReceiptReader"]

#: The error of a receipt root that is a symbolic link (docs/design.md §2).
SYMLINK_NOT_FOLLOWED: Final = "is a symbolic link; not followed"


class ReceiptReader:
    """Reads receipts of one home into its candidates and errors.

    Attributes:
        sample: the process sample liveness is judged against (set by the reader).
        cost: the current observation's cost, counted into.
        seen: while a directory is listed again, the paths read or errored in it.
        servers: the servers registry's entries as last read (empty: none).
    """

    def __init__(
        self,
        home: Home,
        candidates: Candidates,
        errors: Errors,
        cancel: threading.Event,
    ) -> None:
        self.home = home
        self.candidates = candidates
        self.errors = errors
        self.numbers = Numbers()
        self._cancel = cancel
        self.sample: ProcessSample = {}
        self.cost = DiscoveryCost()
        self.seen: set[str] | None = None
        self.servers: list[ServerRegistryEntry] = []
        self._servers_signature: Signature | None = None

    def check_cancelled(self) -> None:
        """Raises: ObservationCancelled: the cancel event is set."""
        if self._cancel.is_set():
            raise ObservationCancelled("active session observation cancelled")

    def set_error(
        self, path: str, message: str, kind: Kind | None = None, signature: Signature | None = None
    ) -> None:
        """An error for ``path`` (see :meth:`~capsuled.reader.errors.Errors.set`)."""
        if self.seen is not None:
            self.seen.add(path)
        self.errors.set(path, message, kind, signature)

    def forget(self, path: str) -> None:
        """Nothing is at ``path``: neither a candidate nor an error."""
        self.candidates.drop(self.home.key(path))
        self.errors.clear(path)

    def read(self, path: str, kind: Kind) -> None:
        """Read, parse and judge one receipt; a failure is an error for its path.

        Raises:
            Shortage: the daemon is short of descriptors or memory; nothing
                about the receipt changed (docs/design.md §8).
        """
        self.check_cancelled()
        self.cost.receipts += 1
        if self.seen is not None:
            self.seen.add(path)
        read_ns = time.time_ns()
        key = self.home.key(path)
        try:
            loaded = self._load(path)
            if loaded is None:
                self.forget(path)
                return
            data, st = loaded
            receipt: Receipt = (
                decode_exec_receipt(data)
                if kind is Kind.EXEC
                else decode_provider_client_receipt(data)
            )
        except ReceiptError as exc:
            self.candidates.drop(key)
            self.set_error(path, str(exc), kind, _error_signature(path, read_ns))
            return
        self.errors.clear(path)
        input_dir = os.path.dirname(os.path.dirname(path))
        signature = Signature.of(st, read_ns)
        candidate = make_candidate(key, kind, receipt, signature, input_dir, self.numbers)
        if candidate.live(self.sample):
            self.candidates.put(key, candidate)
        else:
            self.candidates.drop(key)

    def recheck(self, path: str) -> None:
        """Re-read a candidate or errored receipt, or trust ``lstat`` if nothing changed."""
        key = self.home.key(path)
        candidate = self.candidates.get(key)
        error = self.errors.get(path)
        kind = candidate.kind if candidate is not None else error.kind if error else None
        if kind is None:
            return
        signature = (
            candidate.signature if candidate is not None else error.signature if error else None
        )
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            self.forget(path)
            return
        except OSError:
            st = None
        if st is not None and signature is not None and signature.unchanged(st):
            if candidate is not None and not candidate.live(self.sample):
                self.candidates.drop(key)
            return
        self.read(path, kind)

    def runtime_is_real(self) -> bool:
        """Whether ``runtime`` is no symlink: what is below a link is never read.

        A link there is an error for its path (a gap), as a linked ``runs`` is.
        """
        path = self.home.join(EXEC_PARTS[0])
        try:
            linked = stat.S_ISLNK(os.lstat(path).st_mode)
        except OSError:
            linked = False
        if linked:
            self.set_error(path, SYMLINK_NOT_FOLLOWED)
            return False
        self.errors.clear(path)
        return True

    def read_servers(self) -> None:
        """Read the servers registry (none when missing; an error when unreadable)."""
        path = self.home.join(*SERVERS_PARTS)
        self.check_cancelled()
        self.cost.receipts += 1
        if self.seen is not None:
            self.seen.add(path)
        read_ns = time.time_ns()
        try:
            loaded = self._load(path) if self.runtime_is_real() else None
            if loaded is None:
                self.servers, self._servers_signature = [], None
                self.errors.clear(path)
                return
            data, st = loaded
            self.servers = decode_servers_registry(data)
            self._servers_signature = Signature.of(st, read_ns)
            self.errors.clear(path)
        except ReceiptError as exc:
            self.servers, self._servers_signature = [], None
            self.set_error(path, str(exc))

    def recheck_servers(self) -> None:
        """Read the servers registry again unless ``lstat`` shows it unchanged."""
        path = self.home.join(*SERVERS_PARTS)
        signature = self._servers_signature
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if signature is None and path not in self.errors:
                return
            st = None
        except OSError:
            st = None
        if st is not None and signature is not None and signature.unchanged(st):
            return
        self.read_servers()

    def _load(self, path: str) -> tuple[bytes, os.stat_result] | None:
        """Open without following symlinks or blocking; check type, owner and size; read.

        Returns None when the path no longer exists.

        Raises:
            ReceiptError: a symlink, not a regular file, another user's file,
                larger than 64 KiB, or unreadable.
        """
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise_if_short(exc)  # the daemon's trouble, not the receipt's
            if exc.errno == errno.ELOOP:
                raise ReceiptError("is a symbolic link; receipts are not followed") from exc
            raise ReceiptError(f"cannot open receipt: {describe(exc)}") from exc
        uid = self.home.uid
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ReceiptError("not a regular file")
            if st.st_uid != uid:
                raise ReceiptError(
                    f"owned by uid {st.st_uid}, not {uid}; another user's receipt is refused"
                )
            if st.st_size > MAX_RECEIPT_BYTES:
                raise ReceiptError(f"{st.st_size} bytes, larger than {MAX_RECEIPT_BYTES}")
            data = _read_at_most(fd, MAX_RECEIPT_BYTES + 1)
        except OSError as exc:
            raise_if_short(exc)
            raise ReceiptError(f"cannot read receipt: {describe(exc)}") from exc
        finally:
            os.close(fd)
        if len(data) > MAX_RECEIPT_BYTES:
            raise ReceiptError(f"larger than {MAX_RECEIPT_BYTES} bytes")
        self.cost.bytes += len(data)
        return data, st


def _error_signature(path: str, read_ns: int) -> Signature | None:
    """The signature of a receipt that failed, taken after the attempt.

    Taken after, not before (the open's own ``fstat`` is the signature of
    what a good read read): a write after the attempt leaves a timestamp
    inside the racy window, which makes the signature unstable, so the
    next check reads it again instead of trusting it.
    """
    try:
        return Signature.of(os.lstat(path), read_ns)
    except OSError:
        return None


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
