"""The encoded answer (docs/design.md §7): the lists are encoded again only when the
generation says the answer changed, never by which list objects an answer holds."""

from __future__ import annotations

import msgspec

from capsule_client.wire import ActiveSessionsSnapshot, DiscoveryCost, Session, SessionProcess
from capsuled.discovery.encoded_answer import EncodedAnswer
from capsuled.reader import Generations


def answer(pid: int, *, discovery: str = "ready") -> ActiveSessionsSnapshot:
    process = SessionProcess(kind="exec", pid=pid, started_at=1, exec_id=f"exe_{pid}")
    return ActiveSessionsSnapshot(
        home="/h",
        observed_at=1.0,
        generation=0,
        task=None,
        discovery=discovery,  # type: ignore[arg-type]
        sessions=[] if discovery == "scanning" else [Session("ses_a", None, [process])],
        unowned=[] if discovery == "scanning" else [process],
        servers=[],
        gaps=[],
        cost=DiscoveryCost(),
    )


def decoded(parts: tuple[bytes, ...]) -> object:
    return msgspec.json.decode(b"".join(parts))


def test_the_parts_are_the_answer_and_equal_answers_share_their_lists() -> None:
    generations = Generations()
    encoded = EncodedAnswer()
    first = generations.stamp(answer(10))
    parts = encoded.parts(first, "t")
    assert decoded(parts) == msgspec.to_builtins(msgspec.structs.replace(first, task="t"))
    assert encoded.parts(first, "t") is parts  # the same again costs nothing

    again = generations.stamp(answer(10))  # equal lists, other objects: same generation
    assert again.generation == first.generation and again.sessions is not first.sessions
    reused = encoded.parts(again, "t")
    assert reused[1] is parts[1] and reused[3] is parts[3]
    assert decoded(reused) == msgspec.to_builtins(msgspec.structs.replace(again, task="t"))


def test_a_new_generation_or_a_scanning_answer_is_encoded_afresh() -> None:
    generations = Generations()
    encoded = EncodedAnswer()
    first = generations.stamp(answer(10))
    parts = encoded.parts(first, None)
    changed = generations.stamp(answer(11))
    assert changed.generation == first.generation + 1
    assert decoded(encoded.parts(changed, None)) == msgspec.to_builtins(changed)

    scanning = generations.stamp(answer(11, discovery="scanning"))
    assert scanning.generation == changed.generation  # not counted, lists empty
    assert decoded(encoded.parts(scanning, None)) == msgspec.to_builtins(scanning)
    settled = generations.stamp(answer(11))
    assert decoded(encoded.parts(settled, None)) == msgspec.to_builtins(settled)
    assert parts[1] != encoded.parts(settled, None)[1]
