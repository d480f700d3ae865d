"""``capsulectl`` usage errors exit 2 with a reason, before any connection (docs/design.md §9)."""

from __future__ import annotations

import argparse
import importlib.metadata

import pytest

from capsule_client.cli.main import main
from capsule_client.cli.parser import COMMANDS, parse


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "soon"])
def test_a_timeout_that_is_not_a_positive_number_is_a_usage_error(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--timeout", timeout, "ping"]) == 2
    err = capsys.readouterr().err
    assert "--timeout" in err and "positive number of seconds" in err
    assert "Traceback" not in err


def test_a_positive_timeout_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens there: the command gets as far as connecting (exit 3).
    assert main(["--socket", "/nonexistent/capsuled.sock", "--timeout", "0.5", "ping"]) == 3
    assert "not running" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["run", "--json", "--", "true"], ["--json", "mcp"]])
def test_json_for_a_command_that_prints_no_result_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--socket", "/nonexistent/capsuled.sock", *argv]) == 2
    assert "--json does not apply to" in capsys.readouterr().err


def test_an_empty_socket_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ping", "--socket", ""]) == 2
    assert "must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize("interval", ["nan", "inf", "-inf", "3601", "1e9", "0", "-1", "soon"])
def test_a_top_interval_that_is_not_a_positive_number_up_to_an_hour_is_a_usage_error(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Checked before connecting: nothing listens on this socket.
    argv = ["--socket", "/nonexistent/capsuled.sock", "top", "--interval", interval]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--interval" in err and "Traceback" not in err
    if interval in ("3601", "1e9"):
        assert "at most 3600 seconds" in err  # the interval's own limit, not --timeout's


@pytest.mark.parametrize("timeout", ["86401", "1e12", "1e300"])
def test_a_timeout_longer_than_a_day_is_a_usage_error(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Checked before connecting: nothing listens on this socket.
    assert main(["--socket", "/nonexistent/capsuled.sock", "--timeout", timeout, "ping"]) == 2
    err = capsys.readouterr().err
    assert "--timeout" in err and "at most 86400 seconds" in err
    assert "Traceback" not in err


def test_a_socket_path_too_long_for_a_unix_socket_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = "/tmp/" + "d" * 120 + "/capsuled.sock"
    assert main(["--socket", path, "status"]) == 2
    err = capsys.readouterr().err
    assert f"socket path {path} is longer than the 107 bytes a Unix socket allows" in err
    assert "not running" not in err


def test_version_prints_the_installed_version_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"capsulectl {importlib.metadata.version('capsuled')}\n"


def test_version_among_other_options_prints_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--timeout", "3", "--version"]) == 0
    assert capsys.readouterr().out == f"capsulectl {importlib.metadata.version('capsuled')}\n"


@pytest.mark.parametrize("argv", [["--help"], ["--help", "sessions"], ["-h", "run", "--", "x"]])
def test_the_top_level_help_lists_every_command_whatever_follows(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    out = capsys.readouterr().out
    for name, command in COMMANDS.items():
        assert f"    {name} " in out and command.help[:40] in out, name


def test_a_command_s_help_shows_its_own_arguments_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "--help"]) == 0
    sessions = capsys.readouterr().out
    assert main(["mcp", "--help"]) == 0
    mcp = capsys.readouterr().out

    assert sessions.startswith("usage: capsulectl sessions") and "--wide" in sessions
    assert "--allow-terminate" not in sessions
    assert "--allow-terminate" in mcp and "--wide" not in mcp


def test_the_options_every_command_takes_go_before_or_after_it() -> None:
    before = parse(["--json", "--socket", "/tmp/s", "--timeout", "2", "terminate", "ses_a"])
    after = parse(["terminate", "ses_a", "--json", "--socket", "/tmp/s", "--timeout", "2"])

    assert isinstance(before, argparse.Namespace) and isinstance(after, argparse.Namespace)
    assert vars(before) == vars(after)
    assert vars(before) == {
        "command": "terminate",
        "json": True,
        "socket": "/tmp/s",
        "timeout": 2.0,
        "session_id": "ses_a",
        "ended": False,
        "older_than": None,
        "dry_run": False,
        "signal": "TERM",
        "wide": False,
        "grace": 5.0,
    }


def test_a_command_line_the_first_look_cannot_read_gets_argparse_s_own_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--", "ping"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: '--'" in err and "'sessions'" in err  # every command listed
