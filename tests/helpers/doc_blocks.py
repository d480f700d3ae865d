"""The marked blocks of the docs, and the shapes of their sample outputs (test_docs.py).

A fenced block is run or checked only when the line right before its fence
is a marker, an HTML comment (invisible on GitHub)::

    <!-- doc-test: KIND [option=value ...] -->

Kinds:

* ``setup``: a shell block run first in every document's shell
  (CONTRIBUTING.md's line that puts the venv's commands on ``PATH``);
* ``run``: a shell (``sh``) or ``python`` block, run command by command.
  Options: ``status=N`` (each command's exit status, default 0),
  ``interrupt-after=S`` (a command still running S seconds after its first
  line of output gets SIGINT, as Ctrl-C would, and must then exit with
  ``status``),
  ``meanwhile="COMMAND"`` (run once the command printed its first line; the
  interrupt then comes S seconds after it), and ``<name>="REGEX"``: the
  placeholder ``<name>`` in the commands is the first group of the last
  match of REGEX in what the document's commands printed so far;
* ``shape``: a plain block showing what the last command of the run block
  before it printed: the same lines, with every number, 8-digit hex tag,
  ``...`` or ``…`` standing for any such (see :func:`shape_pattern`);
* ``exchange``: ``→`` lines sent on one connection to the daemon, ``←``
  lines the shapes of the JSON messages that come back, in order
  (``meanwhile`` runs before the last one is read).

Blocks without a marker are prose for people, and are never run.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

MARKER = re.compile(r"^<!-- doc-test: (?P<kind>[a-z]+)(?P<options>.*?) -->$")
KINDS = ("setup", "run", "shape", "exchange")


@dataclass
class Block:
    """One marked fenced block: where it is, its kind and options, its text."""

    path: Path
    line: int
    kind: str
    lang: str
    text: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def placeholders(self) -> dict[str, str]:
        return {key: value for key, value in self.options.items() if key.startswith("<")}


def marked_blocks(path: Path) -> list[Block]:
    """Every marked block of the Markdown file ``path``, in order.

    Raises:
        ValueError: a marker of an unknown kind, or not followed by a fence.
    """
    lines = path.read_text().splitlines()
    blocks = []
    for number, line in enumerate(lines):
        marker = MARKER.match(line.strip())
        if marker is None:
            continue
        where = f"{path.name}:{number + 1}"
        if marker["kind"] not in KINDS:
            raise ValueError(f"{where}: unknown doc-test kind {marker['kind']!r}")
        fence = lines[number + 1] if number + 1 < len(lines) else ""
        if not fence.startswith("```"):
            raise ValueError(f"{where}: a doc-test marker must stand right before a fence")
        end = next(i for i in range(number + 2, len(lines)) if lines[i].startswith("```"))
        options = {}
        for word in shlex.split(marker["options"]):
            key, _, value = word.partition("=")
            options[key] = value
        text = "\n".join(lines[number + 2 : end])
        blocks.append(Block(path, number + 2, marker["kind"], fence[3:].strip(), text, options))
    return blocks


# --------------------------------------------------------------------------
# Text shapes

#: What varies between runs in a sample: an 8-digit hex tag (the demo's ids),
#: a number (pids, generations, ages, sizes with their unit), an elision.
_VARIABLE = re.compile(
    r"(?P<tag>(?<![0-9a-z])[0-9a-f]{8}(?![0-9a-z]))"
    r"|(?P<number>\d+(?:\.\d+)?[KMG]?)"
    r"|(?P<elided>\.\.\.|…)"
    r"|(?P<space> +)"
)
#: A sample token at least this long names one thing (a pid, an id's tag, a
#: generation): it is bound to what the run printed in its place.
_BINDS_FROM = 5


def _line_pattern(line: str) -> tuple[re.Pattern[str], list[str]]:
    parts: list[str] = []
    tokens: list[str] = []
    at = 0
    for match in _VARIABLE.finditer(line):
        parts.append(re.escape(line[at : match.start()]))
        at = match.end()
        if match["tag"]:
            parts.append("([0-9a-f]{8})")
            tokens.append(match["tag"])
        elif match["number"]:
            parts.append(r"(\d+(?:\.\d+)?[KMG]?)")
            tokens.append(match["number"])
        elif match["elided"]:
            parts.append(".*")
        else:
            parts.append(" +")
    parts.append(re.escape(line[at:]))
    return re.compile("".join(parts)), tokens


def shape_pattern(sample: str) -> list[tuple[re.Pattern[str], list[str]]]:
    """Each line of ``sample`` as a pattern, with the sample tokens its groups stand for."""
    return [_line_pattern(line.rstrip()) for line in sample.strip("\n").splitlines()]


def match_shape(sample: str, printed: str, bound: dict[str, str]) -> str | None:
    """Why ``printed`` does not have the shape of ``sample``, or None if it has.

    Tokens of the sample that name one thing (:data:`_BINDS_FROM`) are bound
    in ``bound`` to what was printed in their place; a token bound before
    must be printed as it was then.
    """
    patterns = shape_pattern(sample)
    lines = [line.rstrip() for line in printed.strip("\n").splitlines()]
    if len(lines) != len(patterns):
        return f"{len(lines)} lines printed, the sample shows {len(patterns)}"
    new: dict[str, str] = {}
    for number, ((pattern, tokens), line) in enumerate(zip(patterns, lines, strict=True)):
        match = pattern.fullmatch(line)
        if match is None:
            return f"line {number + 1} {line!r} does not have the shape of {pattern.pattern!r}"
        for token, value in zip(tokens, match.groups(), strict=True):
            if len(token) < _BINDS_FROM:
                continue
            known = bound.get(token, new.get(token))
            if known is not None and known != value:
                return f"line {number + 1}: {token} stood for {known} before, here for {value}"
            new[token] = value
    bound.update(new)
    return None


def substitute(text: str, bound: Mapping[str, str]) -> str:
    """``text`` with each bound sample token (a whole word) spelt as it was printed."""
    for token in sorted(bound, key=len, reverse=True):
        text = re.sub(rf"(?<![0-9A-Za-z]){re.escape(token)}(?![0-9A-Za-z])", bound[token], text)
    return text


# --------------------------------------------------------------------------
# JSON shapes

_ANY = "…any list…"
_MORE = "…more members…"


def json_sample(text: str) -> Any:
    """A JSON sample as data: ``[…]`` is any list, a member ``…`` allows more members."""
    text = text.replace("[…]", f'"{_ANY}"')
    text = re.sub(r",\s*…\s*(?=[,}])", f',"{_MORE}":null', text)
    return msgspec.json.decode(text.encode())


def json_mismatch(sample: Any, actual: Any, where: str = "$") -> str | None:
    """Where ``actual`` differs in shape from ``sample``, or None.

    Objects have the sample's members (more only where it says ``…``); a
    sample list's items are the shapes the actual items may take; strings,
    numbers and booleans match by type.
    """
    if sample == _ANY:
        return None
    if isinstance(sample, dict):
        return _object_mismatch(sample, actual, where)
    if isinstance(sample, list):
        if not isinstance(actual, list) or bool(sample) != bool(actual):
            return f"{where}: {actual!r} where the sample shows {sample!r}"
        for index, item in enumerate(actual):
            whys = [json_mismatch(shape, item, f"{where}[{index}]") for shape in sample]
            if all(why is not None for why in whys):
                return whys[0]
        return None
    for kind in (bool, int | float, str, type(None)):
        if isinstance(sample, kind):
            return None if isinstance(actual, kind) else f"{where}: {actual!r} for {sample!r}"
    return f"{where}: unexpected sample {sample!r}"


def _object_mismatch(sample: dict[str, Any], actual: Any, where: str) -> str | None:
    if not isinstance(actual, dict):
        return f"{where}: an object was shown, {actual!r} came"
    keys = set(sample) - {_MORE}
    extra = set(actual) - keys
    if keys - set(actual) or (extra and _MORE not in sample):
        return f"{where}: members {sorted(actual)}, the sample shows {sorted(keys)}"
    for key in sorted(keys):
        if (why := json_mismatch(sample[key], actual[key], f"{where}.{key}")) is not None:
            return why
    return None


def exchange_lines(text: str) -> Iterator[tuple[str, str]]:
    """The ``→`` and ``←`` messages of an exchange block, continuation lines joined."""
    direction, message = "", ""
    for line in text.splitlines():
        if line.startswith(("→ ", "← ")):
            if direction:
                yield direction, message
            direction, message = line[0], line[2:]
        else:
            message += line.strip()
    if direction:
        yield direction, message
