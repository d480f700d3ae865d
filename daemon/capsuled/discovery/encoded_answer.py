"""The encoded answer: the latest snapshot's JSON in parts, its long lists encoded once.

``sessions.snapshot`` answers with the reply's JSON in parts (docs/design.md §7):
the latest answer is encoded once per observation and ``task``, and its two
long lists (``sessions``, ``unowned``) once per change of the answer, each in
its own buffer that the parts refer to. "The answer did not change" is told
by its generation (:func:`~capsuled.reader.same_answer`), never by which list
objects it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, cast

import msgspec

from capsule_client.wire import ActiveSessionsSnapshot, Session, SessionProcess
from capsuled.reader import same_answer

__all__ = ["EncodedAnswer", "encoder"]

#: One encoder for every snapshot the daemon encodes.
encoder: Final = msgspec.json.Encoder()

#: What the two long lists are replaced by while the rest of a snapshot is encoded.
_PLACEHOLDERS: Final = b'"sessions":0,"unowned":0'
_SESSIONS_KEY: Final = b'"sessions":'
_UNOWNED_KEY: Final = b',"unowned":'


@dataclass(frozen=True, slots=True)
class _Encoded:
    """A snapshot's JSON text in parts: the lists ``sessions`` and ``unowned``
    encoded on their own, the rest around them."""

    answer: ActiveSessionsSnapshot
    task: str | None
    #: The head up to ``"sessions":``, the sessions, ``,"unowned":``, the unowned, the tail.
    parts: tuple[bytes, bytes, bytes, bytes, bytes]


class EncodedAnswer:
    """The parts of the latest answer encoded, kept until another answer or ``task`` is asked."""

    def __init__(self) -> None:
        self._latest: _Encoded | None = None

    def parts(self, answer: ActiveSessionsSnapshot, task: str | None) -> tuple[bytes, ...]:
        """``answer`` with ``task`` as JSON, in parts that joined are the JSON text.

        The same answer and ``task`` again cost nothing; a new answer that says
        the same as the previous one (same generation, both settled) re-encodes
        only the rest (the observed time, the cost), never the lists.
        """
        latest = self._latest
        if latest is not None and latest.answer is answer and latest.task == task:
            return latest.parts
        self._latest = _encode(answer, task, latest)
        return self._latest.parts


def _encode(
    answer: ActiveSessionsSnapshot, task: str | None, previous: _Encoded | None
) -> _Encoded:
    """Encode ``answer`` with ``task``, reusing ``previous``'s lists when the answer is the same."""
    if previous is not None and same_answer(previous.answer, answer):
        sessions, unowned = previous.parts[1], previous.parts[3]
    else:
        sessions = encoder.encode(answer.sessions)
        unowned = encoder.encode(answer.unowned)
    placeholder = msgspec.Raw(b"0")
    rest = msgspec.structs.replace(
        answer,
        task=task,
        sessions=cast(list[Session], placeholder),
        unowned=cast(list[SessionProcess], placeholder),
    )
    head = encoder.encode(rest)
    at = head.index(_PLACEHOLDERS)  # the keys come after strings, which escape '"'
    parts = (
        head[:at] + _SESSIONS_KEY,
        sessions,
        _UNOWNED_KEY,
        unowned,
        head[at + len(_PLACEHOLDERS) :],
    )
    return _Encoded(answer, task, parts)
