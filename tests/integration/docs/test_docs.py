"""The docs run: README.md, CONTRIBUTING.md, docs/sessions.md and docs/protocol.md,
against real daemons.

Each document gets a shell of its own in a fresh directory: ``XDG_RUNTIME_DIR``
unset (as in containers, under ``su`` and over ssh), ``CAPSULE_HOME`` a fresh
home served by a real daemon, the venv's commands *not* on ``PATH`` until
CONTRIBUTING.md's ``setup`` block puts them there. The marked blocks (tests/helpers/doc_blocks.py
says how blocks are marked) then run in order, each command checked for its
exit status and the sample outputs for their shape. ``/tmp/`` in a block is
this test's own directory. A command that starts the daemon in the
foreground (``make run``, ``capsuled ...``) starts the tests' launcher
instead, on the home and socket that command would serve, replacing the
test's own daemon there (as a daemon a user started before, stopped first).
A second one on a socket a daemon the document started still serves fails:
in a shell it would exit 1, "already running".
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psutil
import pytest
from helpers.daemon import DaemonProcess, short_tmpdir
from helpers.doc_blocks import (
    Block,
    exchange_lines,
    json_mismatch,
    json_sample,
    marked_blocks,
    match_shape,
    substitute,
)

from benchmarks.scenarios import SCENARIOS

ROOT = Path(__file__).parents[3]
DOCS = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "docs" / "sessions.md",
    ROOT / "docs" / "protocol.md",
]
#: The document whose ``setup`` block every document's shell runs first.
SETUP = ROOT / "CONTRIBUTING.md"
#: The longest a documented command may take (the daemon answers in milliseconds).
COMMAND_TIMEOUT_S = 30.0
_DAEMON_START = re.compile(r"^(?:make run|(?:\.venv/bin/)?capsuled)(?=\s|$)(?P<args>[^#]*)")
_PLACEHOLDER = re.compile(r"<[a-z_]+>")


def _path_without_the_venv() -> str:
    """This ``PATH`` less every directory with a ``capsulectl`` (the docs must add it)."""
    kept = [
        entry
        for entry in os.environ.get("PATH", os.defpath).split(os.pathsep)
        if entry and not (Path(entry) / "capsulectl").exists()
    ]
    return os.pathsep.join(kept)


def commands(text: str) -> Iterator[str]:
    """The shell commands of a block: lines gathered until bash reads them as complete."""
    pending = ""
    for line in text.splitlines():
        pending += line + "\n"
        if not pending.strip() or pending.lstrip().startswith("#"):
            pending = ""
            continue
        syntax = _PLACEHOLDER.sub("placeholder", pending)  # <name> is no redirection
        check = subprocess.run(["bash", "-n", "-c", syntax], capture_output=True)
        if check.returncode == 0:
            yield pending.rstrip("\n")
            pending = ""
    assert not pending.strip(), f"an incomplete command at the end of the block: {pending!r}"


class DocShell:
    """One document's shell: its environment (kept between commands), daemons and output."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "shell.env"
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("CAPSULE", "XDG_", "VIRTUAL_ENV", "PYTHON"))
        }
        env |= {
            "PATH": _path_without_the_venv(),
            "XDG_STATE_HOME": str(tmp / "state"),
            "CAPSULE_HOME": str(tmp / "home"),
        }
        self.state.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
        self.daemons: dict[Path, DaemonProcess] = {}
        self.started: set[Path] = set()  # sockets a daemon the document started serves
        self.printed = ""  # everything the commands printed, for the placeholders
        self.bound: dict[str, str] = {}  # sample tokens -> what was printed in their place
        self.last = ""  # what the last command printed

    # ---------------------------------------------------------------- environment

    def variable(self, name: str) -> str:
        script = f'set -a; . "{self.state}"; printf %s "${{{name}:-}}"'
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout

    def start_daemon(self, args: list[str], block: Block | None = None) -> None:
        """Start the launcher where ``capsuled ARGS`` would serve, in this shell's environment.

        ``block``: the document's block that starts it; a second daemon it
        starts on a socket its first one serves fails the test.
        """
        home = Path(self.variable("CAPSULE_HOME") or f"{self.variable('XDG_STATE_HOME')}/capsule")
        runtime = self.variable("XDG_RUNTIME_DIR")
        socket_path = Path(
            self.variable("CAPSULED_SOCKET")
            or (f"{runtime}/capsuled.sock" if runtime else f"{home}/capsuled.sock")
        )
        if block is not None:
            assert socket_path not in self.started, (
                f"{block.where}: a second daemon on {socket_path}, which the daemon the "
                "document started serves: in a shell it exits 1 (already running)"
            )
            self.started.add(socket_path)
        if (running := self.daemons.pop(socket_path, None)) is not None:
            assert running.stop() == 0, running.log_tail()
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.daemons[socket_path] = DaemonProcess(home, socket_path, args).start()

    def close(self) -> None:
        """Kill what the documents' commands left running (their environment names this
        shell's directory: the demo's sleeps), then the daemons."""
        mine = f"XDG_STATE_HOME={self.tmp}/state"
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if process.pid != os.getpid() and mine in [
                    f"{key}={value}" for key, value in process.environ().items()
                ]:
                    process.kill()
        for daemon in self.daemons.values():
            daemon.kill()

    # ---------------------------------------------------------------- commands

    def resolve(self, command: str, block: Block) -> str:
        command = substitute(command.replace("/tmp/", f"{self.tmp}/"), self.bound)
        for name in set(_PLACEHOLDER.findall(command)):
            pattern = block.placeholders.get(name)
            assert pattern is not None, f"{block.where}: {name} is not declared in the marker"
            found = re.findall(pattern, self.printed, re.MULTILINE)
            assert found, f"{block.where}: nothing printed so far matches {name}={pattern!r}"
            command = command.replace(name, found[-1])
        return command

    def run(self, command: str, block: Block) -> None:
        """Run one command of ``block`` and check its exit status."""
        command = self.resolve(command, block)
        start = _DAEMON_START.match(command)
        if start is not None and block.kind == "run":
            self.start_daemon(shlex.split(start["args"]), block)
            return
        if block.lang == "python":
            command = f"python - <<'DOC_TEST_PYTHON'\n{command}\nDOC_TEST_PYTHON"
        script = f'set -a\n. "{self.state}"\ntrap \'export -p > "{self.state}"\' EXIT\n'
        script += f"set -o pipefail\n{command}\n"
        with subprocess.Popen(
            ["bash", "-c", script],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as process:
            out, err = self._wait(process, block)
        self.last = out.decode(errors="replace")
        self.printed += self.last
        expected = int(block.options.get("status", "0"))
        assert process.returncode == expected, (
            f"{block.where}: {command!r} exited {process.returncode}, not {expected}\n"
            f"stdout: {self.last}\nstderr: {err.decode(errors='replace')}"
        )

    def _wait(self, process: subprocess.Popen[bytes], block: Block) -> tuple[bytes, bytes]:
        interrupt = block.options.get("interrupt-after")
        if interrupt is None:
            try:
                return process.communicate(timeout=COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                pytest.fail(
                    f"{block.where}: {process.args!r} still ran after {COMMAND_TIMEOUT_S} s"
                )
        assert process.stdout is not None and process.stderr is not None
        out: list[bytes] = []
        err: list[bytes] = []
        first_line = threading.Event()

        def read_out() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                out.append(line)
                first_line.set()
            first_line.set()  # it ended without a line

        readers = [
            threading.Thread(target=read_out),
            threading.Thread(target=lambda: err.append(process.stderr.read())),  # type: ignore[union-attr]
        ]
        for reader in readers:
            reader.start()
        # Timed from its first line: by then it is past its start-up and handles Ctrl-C.
        assert first_line.wait(COMMAND_TIMEOUT_S), f"{block.where}: nothing printed"
        if "meanwhile" in block.options:
            self.meanwhile(block)
        try:
            process.wait(timeout=float(interrupt))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C, to the whole foreground group
            try:
                process.wait(timeout=COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                pytest.fail(f"{block.where}: {process.args!r} did not end on SIGINT")
        for reader in readers:
            reader.join()
        return b"".join(out), b"".join(err)

    def meanwhile(self, block: Block) -> None:
        command = self.resolve(block.options["meanwhile"], block)
        script = f'set -a; . "{self.state}"; {command}'
        result = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
        assert result.returncode == 0, f"{block.where}: meanwhile {command!r}: {result.stderr}"

    # ---------------------------------------------------------------- samples

    def check_shape(self, block: Block) -> None:
        sample = block.text.replace("/tmp/", f"{self.tmp}/")
        if block.lang == "json":
            why = json_mismatch(json_sample(sample), msgspec.json.decode(self.last.encode()))
        else:
            why = match_shape(sample, self.last, self.bound)
        assert why is None, f"{block.where}: {why}\nprinted:\n{self.last}"

    def exchange(self, block: Block) -> None:
        """Send the ``→`` messages on one connection, match the ``←`` ones as they come."""
        messages = list(exchange_lines(block.text))
        replies = [json_sample(text) for direction, text in messages if direction == "←"]
        sock_path = (
            self.variable("CAPSULED_SOCKET") or f"{self.variable('CAPSULE_HOME')}/capsuled.sock"
        )
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(COMMAND_TIMEOUT_S)
            sock.connect(sock_path)
            sock.sendall(b"".join(t.encode() + b"\n" for d, t in messages if d == "→"))
            lines = sock.makefile("rb")
            for index, sample in enumerate(replies):
                if index == len(replies) - 1 and "meanwhile" in block.options:
                    self.meanwhile(block)
                line = lines.readline()
                why = json_mismatch(sample, msgspec.json.decode(line))
                assert why is None, f"{block.where}: message {index + 1}: {why}\n{line!r}"


def run_document(path: Path, setup: list[Block]) -> None:
    with short_tmpdir() as tmp:
        shell = DocShell(tmp)
        try:
            shell.start_daemon([])
            for block in setup:
                for command in commands(block.text):
                    shell.run(command, block)
            for block in marked_blocks(path):
                if block.kind == "run":
                    texts = [block.text] if block.lang == "python" else commands(block.text)
                    for command in texts:
                        shell.run(command, block)
                elif block.kind == "shape":
                    shell.check_shape(block)
                elif block.kind == "exchange":
                    shell.exchange(block)
        finally:
            shell.close()


@pytest.mark.parametrize("path", DOCS, ids=[path.name for path in DOCS])
def test_the_documents_run_as_written(path: Path) -> None:
    setup = [block for block in marked_blocks(SETUP) if block.kind == "setup"]
    assert setup, f"{SETUP.name} says how to put the venv's commands on PATH"
    run_document(path, setup)


def test_every_document_has_marked_blocks_and_contributing_counts_the_scenarios() -> None:
    for path in DOCS:
        assert any(block.kind in ("run", "exchange") for block in marked_blocks(path)), path
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    assert f"runs {len(SCENARIOS)} scenarios" in contributing


def test_a_sample_that_no_longer_fits_fails() -> None:
    """The shapes are strict enough to fail: a changed word, a missing line, a moved pid."""
    sample = (
        "SESSION  PID\nses_demo_1f2e3d4c  41230\ndiscovery: ready (generation 1796158065123456)"
    )
    printed = "SESSION  PID\nses_demo_0a1b2c3d  977\ndiscovery: ready (generation 1796158065999999)"
    bound: dict[str, str] = {}
    assert match_shape(sample, printed, bound) is None
    assert bound == {"1f2e3d4c": "0a1b2c3d", "41230": "977", "1796158065123456": "1796158065999999"}
    assert substitute("kill 41230", bound) == "kill 977"
    assert match_shape(sample, printed.replace("ready", "scanning"), {}) is not None
    assert match_shape(sample, printed.rsplit("\n", 1)[0], {}) is not None
    assert match_shape("pid 41230\npid 41230", "pid 1\npid 2", {}) is not None
    shown = json_sample('{"a": 1, "b": [{"c": "x"}], …}')
    assert json_mismatch(shown, {"a": 2, "b": [{"c": "y"}], "d": None}) is None
    assert json_mismatch(shown, {"a": "2", "b": [{"c": "y"}]}) is not None
    assert json_mismatch(shown, {"a": 2, "b": [{"c": "y", "e": 1}]}) is not None
