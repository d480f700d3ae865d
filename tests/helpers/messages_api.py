"""A stand-in for the Anthropic Messages API, scripted per test.

Claude Code reads its model over HTTP from ``ANTHROPIC_BASE_URL``; pointed at
this server it runs offline, and each test decides what "the model" says: a
script of turns, one per streaming ``POST /v1/messages`` (the agent's loop),
each a text or one or more tool calls. Claude Code runs the tools it is told
to run, hooks and all, and sends their results back in the next request; the
server keeps every request's parsed body, so a test asserts on what reached
the model (a ``SessionStart`` hook's ``additionalContext``, a ``tool_result``).

What the server answers:

* a streaming ``POST /v1/messages`` (``"stream": true``): the next turn of the
  script as server-sent events, in the order the API sends them
  (``message_start``, per block ``content_block_start`` / ``_delta`` /
  ``_stop``, ``message_delta`` with the stop reason, ``message_stop``); a text
  block streams ``text_delta`` events, a ``tool_use`` block ``input_json_delta``
  events. Once the script is spent, every further turn is ``after_script``
  (by default a short final text), and :attr:`MessagesAPI.unscripted` counts them;
* a non-streaming ``POST /v1/messages``: one JSON message with ``side_reply``'s
  text (no turn of the script is used);
* ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, N a rough estimate;
* any ``GET`` or ``HEAD`` (the client may probe the base URL): ``200 {}``;
* anything else: ``404`` with the API's error shape.

A turn may be a function of the request it answers (called in the server's
thread): it can pick a tool call from an earlier ``tool_result``, or block on
an event to hold the agent in the middle of a turn.

Only the standard library: ``http.server.ThreadingHTTPServer`` on 127.0.0.1
and an ephemeral port, one thread, stopped by the context manager.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Text:
    """A text block the model says."""

    text: str


@dataclass(frozen=True)
class ToolUse:
    """A tool call: ``name`` with ``input``; ``id`` is made up when not given."""

    name: str
    input: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None


Block = Text | ToolUse
Reply = Block | Sequence[Block]
Turn = Reply | Callable[["Request"], Reply]


@dataclass(frozen=True)
class Request:
    """One request the server received.

    Attributes:
        method: ``GET``, ``POST``…
        path: the path with its query (``/v1/messages?beta=true``).
        headers: the request's headers, names lower-cased.
        body: the parsed JSON body (``None`` without one, the raw text when not JSON).
        turn: for a streaming message request, its index among them (0 for the
            first); ``None`` for every other request.
        scripted: whether that turn came from the script (not ``after_script``).
        received_at: ``time.monotonic()`` when it arrived.
        reply: the blocks it was answered with (message requests only; empty
            while a turn function is still deciding).
    """

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    turn: int | None = None
    scripted: bool = False
    received_at: float = 0.0
    reply: tuple[Block, ...] = ()

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation the request carries (``[]`` for other requests)."""
        if isinstance(self.body, dict):
            return list(self.body.get("messages") or [])
        return []

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools offered to the model, in the request's order."""
        if isinstance(self.body, dict):
            return [tool.get("name", "") for tool in self.body.get("tools") or []]
        return []

    def tool_results(self) -> list[dict[str, Any]]:
        """The ``tool_result`` blocks of the request's last message."""
        if not self.messages:
            return []
        content = self.messages[-1].get("content")
        if not isinstance(content, list):
            return []
        return [block for block in content if block.get("type") == "tool_result"]

    def tool_result(self, tool_use_id: str) -> dict[str, Any]:
        """The ``tool_result`` block answering ``tool_use_id``, anywhere in the conversation.

        Raises:
            KeyError: no message carries one.
        """
        for message in self.messages:
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_result" and block.get("tool_use_id") == tool_use_id:
                    return dict(block)
        raise KeyError(tool_use_id)

    def text(self) -> str:
        """Every text of the conversation and the system prompt, joined: for ``in`` checks."""
        if not isinstance(self.body, dict):
            return "" if self.body is None else str(self.body)
        return "\n".join(_texts([self.body.get("system"), self.messages]))


def result_text(block: Mapping[str, Any]) -> str:
    """The text of a ``tool_result`` block, whether its content is a string or blocks."""
    return "\n".join(_texts(block.get("content")))


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, dict):
        if isinstance(value.get("text"), str):
            yield value["text"]
        if "content" in value:
            yield from _texts(value["content"])


def _blocks(reply: Reply) -> tuple[Block, ...]:
    if isinstance(reply, Text | ToolUse):
        return (reply,)
    blocks = tuple(reply)
    if not blocks or not all(isinstance(block, Text | ToolUse) for block in blocks):
        raise TypeError(f"a turn is a Text, a ToolUse or a non-empty sequence of them: {reply!r}")
    return blocks


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps({'type': event, **data})}\n\n".encode()


def _usage(output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": 10,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


class MessagesAPI:
    """The scripted stand-in; a context manager that serves on 127.0.0.1 while open.

    Args:
        script: the turns, in order: each a :class:`Text`, a :class:`ToolUse`,
            a sequence of them (one message with several blocks), or a function
            of the :class:`Request` that returns one of those.
        after_script: the turn every message request gets once the script is spent.
        side_reply: the text of a non-streaming message request's answer.

    Example::

        with MessagesAPI([ToolUse("Bash", {"command": "true"}), Text("done")]) as api:
            ...  # run claude with ANTHROPIC_BASE_URL=api.url
            assert api.turns[1].tool_results()[0]["is_error"] is False
    """

    def __init__(
        self,
        script: Iterable[Turn] = (),
        *,
        after_script: Turn = Text("Done."),
        side_reply: str = "OK",
    ) -> None:
        self._script: list[Turn] = list(script)
        self._after_script = after_script
        self._side_reply = side_reply
        self._lock = threading.Condition()
        self._requests: list[Request] = []
        self._next_turn = 0
        self._tool_ids = itertools.count(1)
        self._message_ids = itertools.count(1)
        self.errors: list[BaseException] = []  # exceptions raised by turn functions
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle -----------------------------------------------------------

    def __enter__(self) -> MessagesAPI:
        api = self

        class Handler(_Handler):
            owner = api

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},  # how long shutdown() may wait
            name="messages-api",
            daemon=True,
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        if exc is None and self.errors:
            raise AssertionError(f"a turn of the script failed: {self.errors[0]!r}") from (
                self.errors[0]
            )

    @property
    def url(self) -> str:
        """The base URL (``http://127.0.0.1:PORT``), for ``ANTHROPIC_BASE_URL``."""
        assert self._server is not None, "the stand-in is not serving (use it as a context)"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- the script -----------------------------------------------------------

    def extend(self, turns: Iterable[Turn]) -> None:
        """Add turns at the end of the script (also once it was spent)."""
        with self._lock:
            self._script.extend(turns)

    @property
    def script_left(self) -> int:
        """How many turns of the script no request has had yet."""
        with self._lock:
            return max(0, len(self._script) - self._next_turn)

    @property
    def unscripted(self) -> int:
        """How many message requests got ``after_script`` (the script was spent)."""
        return sum(1 for request in self.turns if not request.scripted)

    # -- what was received ----------------------------------------------------

    @property
    def requests(self) -> list[Request]:
        """Every request so far, in the order they arrived (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def turns(self) -> list[Request]:
        """The streaming message requests so far (the agent's loop), in order."""
        return [request for request in self.requests if request.turn is not None]

    def wait_for_turns(self, count: int, *, timeout_s: float = 10.0) -> list[Request]:
        """Wait until ``count`` message requests have arrived; return them.

        Raises:
            AssertionError: fewer arrived within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while (seen := sum(1 for r in self._requests if r.turn is not None)) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{seen} message requests after {timeout_s} s, not {count}"
                    )
                self._lock.wait(remaining)
        return self.turns

    # -- used by the handler --------------------------------------------------

    def _record(self, request: Request) -> int:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()
            return len(self._requests) - 1

    def _answered(self, slot: int, request: Request) -> None:
        with self._lock:
            self._requests[slot] = request

    def _take_turn(self) -> tuple[int, Turn, bool]:
        with self._lock:
            index = self._next_turn
            self._next_turn += 1
            if index < len(self._script):
                return index, self._script[index], True
            return index, self._after_script, False

    def _new_tool_id(self) -> str:
        return f"toolu_standin_{next(self._tool_ids):04d}"

    def _new_message_id(self) -> str:
        return f"msg_standin_{next(self._message_ids):04d}"


class _Handler(BaseHTTPRequestHandler):
    owner: MessagesAPI
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads the kept requests, not a log."""

    def handle(self) -> None:
        """Serve the connection; a client gone (claude killed mid-turn) is not an error."""
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- plumbing -------------------------------------------------------------

    def _body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.headers.get("content-encoding", "").lower() == "gzip":
            raw = gzip.decompress(raw)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def _request(self, body: Any, **extra: Any) -> Request:
        return Request(
            method=self.command,
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
            received_at=time.monotonic(),
            **extra,
        )

    def _json(self, status: int, payload: Any) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, kind: str, message: str) -> None:
        self._json(status, {"type": "error", "error": {"type": kind, "message": message}})

    # -- methods --------------------------------------------------------------

    def do_GET(self) -> None:
        self.owner._record(self._request(None))
        self._json(200, {})

    def do_HEAD(self) -> None:
        self.owner._record(self._request(None))
        self._json(200, None)

    def do_POST(self) -> None:
        body = self._body()
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.endswith("/v1/messages/count_tokens"):
            self.owner._record(self._request(body))
            self._json(200, {"input_tokens": max(1, len(json.dumps(body)) // 4)})
        elif path.endswith("/v1/messages") and isinstance(body, dict) and body.get("stream"):
            self._turn(body)
        elif path.endswith("/v1/messages") and isinstance(body, dict):
            self.owner._record(self._request(body, reply=(Text(self.owner._side_reply),)))
            self._json(200, self._message(body, [self._text_block(self.owner._side_reply)]))
        else:
            self.owner._record(self._request(body))
            self._error(404, "not_found_error", f"the stand-in does not serve {self.path}")

    # -- message requests -----------------------------------------------------

    def _turn(self, body: dict[str, Any]) -> None:
        index, turn, scripted = self.owner._take_turn()
        pending = self._request(body, turn=index, scripted=scripted)
        slot = self.owner._record(pending)  # seen before a turn function runs (it may block)
        try:
            blocks = tuple(
                ToolUse(b.name, b.input, b.id or self.owner._new_tool_id())
                if isinstance(b, ToolUse)
                else b
                for b in _blocks(turn(pending) if callable(turn) else turn)
            )
        except Exception as exc:
            self.owner.errors.append(exc)
            self._error(400, "invalid_request_error", f"the script failed: {exc!r}")
            return
        self.owner._answered(slot, dataclasses.replace(pending, reply=blocks))
        self._stream(body, blocks)

    def _message(self, body: Mapping[str, Any], content: list[Any]) -> dict[str, Any]:
        return {
            "id": self.owner._new_message_id(),
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-standin"),
            "content": content,
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": _usage(len(content)),
        }

    @staticmethod
    def _text_block(text: str) -> dict[str, str]:
        return {"type": "text", "text": text}

    def _stream(self, body: Mapping[str, Any], blocks: Sequence[Block]) -> None:
        start = {**self._message(body, []), "stop_reason": None, "usage": _usage(1)}
        events = [_sse("message_start", {"message": start})]
        for index, block in enumerate(blocks):
            events.extend(self._block_events(index, block))
        stop_reason = "tool_use" if any(isinstance(b, ToolUse) for b in blocks) else "end_turn"
        events.append(
            _sse(
                "message_delta",
                {
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": 5 * len(blocks)},
                },
            )
        )
        events.append(_sse("message_stop", {}))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(b"".join(events))
        self.wfile.flush()
        self.close_connection = True

    @staticmethod
    def _block_events(index: int, block: Block) -> list[bytes]:
        if isinstance(block, Text):
            opening: dict[str, Any] = {"type": "text", "text": ""}
            half = len(block.text) // 2
            deltas = [
                {"type": "text_delta", "text": part}
                for part in (block.text[:half], block.text[half:])
            ]
        else:
            opening = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            encoded = json.dumps(dict(block.input))
            half = len(encoded) // 2
            deltas = [
                {"type": "input_json_delta", "partial_json": part}
                for part in (encoded[:half], encoded[half:])
            ]
        return [
            _sse("content_block_start", {"index": index, "content_block": opening}),
            *(_sse("content_block_delta", {"index": index, "delta": delta}) for delta in deltas),
            _sse("content_block_stop", {"index": index}),
        ]
