"""A generated ``trace.jsonl`` shaped like a busy session's, for scenario 5.

About 95 % of the lines are events reconcile does not act on (model output,
tool calls and results, turns), 20 to 300 words each. Every 40th line
detaches a background shell; most of those complete a few lines later, some
are abandoned, the rest stay unaccounted. Some lines are written with
``ensure_ascii`` (non-ASCII as ``\\u`` escapes), some tool output carries
ANSI colour codes (``\\u001b``) and the text ``"event_type": "shell_detached"``
inside a string, some shell events have their members in another order, and
the file ends in a torn line without its newline.

The shell events use the writer kit's structs (``capsule_client.kit.trace``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["generate_trace"]

WORDS = (
    "the quick brown fox jumps over a lazy dog build test cargo pytest run src lib "
    "fixture daemon socket receipt session trace reconcile épée naïve 東京 ✓"
).split()
ANSI_RED, ANSI_RESET = "\x1b[31m", "\x1b[0m"
SESSION = "ses_bench"
DETACH_EVERY = 40


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


def _chatter(
    rng: random.Random, common: dict[str, Any], n: int, words: tuple[int, int] = (20, 300)
) -> dict[str, Any]:
    kind = rng.choice(("model_output", "tool_call", "tool_result", "turn_start"))
    event: dict[str, Any] = {"event_type": kind, **common, "text": _text(rng, *words)}
    if kind == "tool_result" and n % 7 == 0:
        event["text"] = (
            f"{ANSI_RED}FAILED{ANSI_RESET} grep found "
            '{"event_type": "shell_detached", "work_id": "wrk_fake"} in ' + event["text"]
        )
    return event


def generate_trace(
    path: Path,
    size_bytes: int,
    *,
    seed: int = 5,
    detach_every: int = DETACH_EVERY,
    words: tuple[int, int] = (20, 300),
) -> list[str]:
    """Write about ``size_bytes`` of trace to ``path``; return the unaccounted work ids, sorted.

    Every ``detach_every``-th line detaches a shell (most are accounted for 3
    lines later); the other lines carry ``words`` (fewest, most) words of text.
    """
    from capsule_client.kit.trace import (
        SessionStart,
        ShellAbandoned,
        ShellCompleted,
        ShellDetached,
        TaskStart,
        encode_line,
    )

    rng = random.Random(seed)
    encode: Callable[[Any], bytes] = msgspec.json.Encoder().encode
    open_work: list[tuple[str, str]] = []
    unaccounted: set[str] = set()
    with path.open("wb") as trace:
        trace.write(
            encode_line(SessionStart(event_id="evt_start", session_id=SESSION, timestamp=1))
        )
        trace.write(
            encode_line(
                TaskStart(
                    event_id="evt_task",
                    session_id=SESSION,
                    timestamp=2,
                    task_id="tsk_1",
                    trust="trusted",
                )
            )
        )
        written, n = 0, 0
        while written < size_bytes:
            n += 1
            event_id = f"evt_{n:09d}"
            common: dict[str, Any] = {"event_id": event_id, "session_id": SESSION, "timestamp": n}
            if n % detach_every == 0:
                work_id, command = f"wrk_{n:09d}", _text(rng, 2, 8)
                line = encode_line(
                    ShellDetached(
                        **common,
                        task_id="tsk_1",
                        work_id=work_id,
                        binary="/bin/sh",
                        command=command,
                    )
                )
                open_work.append((work_id, command))
                unaccounted.add(work_id)
            elif n % detach_every == 3 and open_work and rng.random() < 0.9:
                work_id, command = open_work.pop()
                unaccounted.discard(work_id)
                completed = rng.random() < 0.8
                if completed or rng.random() < 0.5:
                    accounting = ShellCompleted if completed else ShellAbandoned
                    line = encode_line(
                        accounting(
                            event_id=event_id,
                            session_id=SESSION,
                            timestamp=n,
                            work_id=work_id,
                            binary="/bin/sh",
                            command=command,
                        )
                    )
                else:  # members in another order, non-ASCII escaped
                    event = {"work_id": work_id, **common, "event_type": "shell_completed"}
                    line = (json.dumps(event, ensure_ascii=True) + "\n").encode()
            else:
                event = _chatter(rng, common, n, words)
                if n % 11 == 0:
                    line = (json.dumps(event, ensure_ascii=True) + "\n").encode()
                else:
                    line = encode(event) + b"\n"
            trace.write(line)
            written += len(line)
        torn = encode(_chatter(rng, {"event_id": "evt_torn", "timestamp": n + 1}, n + 1))
        trace.write(torn[: len(torn) // 2])
    return sorted(unaccounted)
