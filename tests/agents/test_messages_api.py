"""The Messages API stand-in on its own, asked over plain HTTP (tests/helpers/messages_api.py)."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

from helpers.messages_api import MessagesAPI, Request, Text, ToolUse


def post(api: MessagesAPI, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
    request = urllib.request.Request(
        api.url + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.headers["content-type"], response.read()


def events(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events of a stream: (event name, parsed data)."""
    parsed = []
    for chunk in stream.decode().split("\n\n"):
        if chunk.strip():
            name, data = chunk.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            parsed.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return parsed


def assembled(stream: bytes) -> tuple[list[dict[str, Any]], str | None]:
    """The content blocks a client builds from the stream, and the stop reason."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    stop_reason = None
    for name, data in events(stream):
        assert data["type"] == name
        if name == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                blocks[data["index"]]["text"] += delta["text"]
            else:
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif name == "content_block_stop" and data["index"] in partial:
            blocks[data["index"]]["input"] = json.loads(partial[data["index"]])
        elif name == "message_delta":
            stop_reason = data["delta"]["stop_reason"]
    names = [name for name, _ in events(stream)]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    return blocks, stop_reason


def test_turns_stream_in_order_then_the_after_script_text() -> None:
    call = ToolUse("Bash", {"command": "echo hi", "run_in_background": True}, id="toolu_1")
    with MessagesAPI([[Text("Running it."), call], Text("Done it.")]) as api:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
        kind, first = post(api, "/v1/messages?beta=true", body)
        _, second = post(api, "/v1/messages", body)
        _, third = post(api, "/v1/messages", body)

    assert kind == "text/event-stream"
    assert assembled(first) == (
        [
            {"type": "text", "text": "Running it."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "Bash",
                "input": {"command": "echo hi", "run_in_background": True},
            },
        ],
        "tool_use",
    )
    assert assembled(second) == ([{"type": "text", "text": "Done it."}], "end_turn")
    assert assembled(third) == ([{"type": "text", "text": "Done."}], "end_turn")
    assert [request.turn for request in api.turns] == [0, 1, 2]
    assert api.unscripted == 1 and api.script_left == 0
    assert api.turns[0].body == body


def test_other_requests_are_answered_without_using_the_script() -> None:
    with MessagesAPI([Text("scripted")]) as api:
        with urllib.request.urlopen(api.url, timeout=5) as response:
            assert json.loads(response.read()) == {}
        body = {"model": "m", "messages": [{"role": "user", "content": "count"}]}
        _, counted = post(api, "/v1/messages/count_tokens", body)
        _, message = post(api, "/v1/messages", body)  # not streaming

    assert json.loads(counted)["input_tokens"] > 0
    assert json.loads(message)["content"] == [{"type": "text", "text": "OK"}]
    assert [(r.method, r.turn) for r in api.requests] == [
        ("GET", None),
        ("POST", None),
        ("POST", None),
    ]
    assert api.script_left == 1


def test_a_turn_function_sees_its_request_and_may_hold_it() -> None:
    release = threading.Event()

    def answer(request: Request) -> Text:
        release.wait(5)
        return Text(f"you said {request.messages[-1]['content']}")

    with MessagesAPI([answer]) as api:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hey"}]}
        replies: list[bytes] = []
        thread = threading.Thread(target=lambda: replies.append(post(api, "/v1/messages", body)[1]))
        thread.start()
        [held] = api.wait_for_turns(1)  # seen while the function still decides
        assert held.reply == ()
        release.set()
        thread.join(5)

    assert assembled(replies[0]) == ([{"type": "text", "text": "you said hey"}], "end_turn")
    assert api.turns[0].reply == (Text("you said hey"),)
