"""Flags, environment variables and defaults (docs/design.md §2, §8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.registry import CollectorRegistry

from capsule_client.kit.paths import default_home, default_socket
from capsuled.metrics.textfile import TEXTFILE_MIN_INTERVAL_S, TextfileWriter
from capsuled.service.config import ConfigError, build_parser, parse_args


def test_defaults_follow_xdg() -> None:
    env = {"HOME": "/h", "XDG_STATE_HOME": "/state", "XDG_RUNTIME_DIR": "/run/user/1"}
    assert default_home(env) == Path("/state/capsule")
    assert default_socket(environ=env) == Path("/run/user/1/capsuled.sock")
    assert default_home({"CAPSULE_HOME": "/c", **env}) == Path("/c")
    assert default_socket(environ={"CAPSULED_SOCKET": "/s.sock", **env}) == Path("/s.sock")
    assert default_socket(Path("/c"), {}) == Path("/c/capsuled.sock")
    assert default_home({"XDG_STATE_HOME": ""}) == Path.home() / ".local/state/capsule"


def test_relative_xdg_directories_are_ignored() -> None:
    """The XDG base directory specification: a relative path in these variables is invalid."""
    env = {"XDG_STATE_HOME": "state", "XDG_RUNTIME_DIR": "run/user/1"}
    assert default_home(env) == Path.home() / ".local/state/capsule"
    assert default_socket(environ=env) == Path.home() / ".local/state/capsule/capsuled.sock"
    # capsuled's own variables are taken as given.
    assert default_home({"CAPSULE_HOME": "rel", **env}) == Path("rel")


def test_flag_beats_environment_beats_default() -> None:
    env = {"CAPSULE_HOME": "/env-home", "CAPSULED_SAMPLE_INTERVAL": "2.5"}
    config = parse_args([], env)
    assert config.home == Path("/env-home")
    assert config.socket == Path("/env-home/capsuled.sock")
    assert config.sample_interval_s == 2.5
    config = parse_args(["--home", "/flag-home", "--sample-interval", "0.5"], env)
    assert config.home == Path("/flag-home") and config.sample_interval_s == 0.5
    defaults = parse_args([], {"CAPSULE_HOME": "/x"})
    assert (defaults.verify_interval_s, defaults.poll_interval_s) == (30.0, 0.5)
    assert (
        parse_args([], {"CAPSULE_HOME": "/x", "CAPSULED_VERIFY_INTERVAL": "5"}).verify_interval_s
        == 5.0
    )
    assert parse_args(["--poll-interval", "0.1"], {"CAPSULE_HOME": "/x"}).poll_interval_s == 0.1


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--sample-interval", "0"], "sample interval"),
        (["--sample-interval", "nan"], "sample interval"),
        (["--verify-interval", "soon"], "verify interval"),
        (["--poll-interval", "-1"], "poll interval"),
        (["--log-format", "xml"], "log format"),
        (["--log-level", "loud"], "log level"),
        (["--max-connections", "0"], "max connections"),
        (["--socket", "/" + "s" * 120], "107 bytes"),
    ],
)
def test_bad_values_are_named(argv: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_args(["--home", "/h", *argv], {})


# --------------------------------------------------------------------------
# --write-timeout / CAPSULED_WRITE_TIMEOUT (docs/protocol.md, "Slow readers")


def test_write_timeout_flag_beats_environment_beats_default() -> None:
    assert parse_args(["--home", "/h"], {}).write_timeout_s == 10.0
    env = {"CAPSULED_WRITE_TIMEOUT": "2.5"}
    assert parse_args(["--home", "/h"], env).write_timeout_s == 2.5
    assert parse_args(["--home", "/h", "--write-timeout", "0.25"], env).write_timeout_s == 0.25


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_write_timeout_is_named(value: str) -> None:
    with pytest.raises(ConfigError, match="write timeout"):
        parse_args(["--home", "/h", "--write-timeout", value], {})


def test_help_names_the_write_timeout_variable() -> None:
    assert "CAPSULED_WRITE_TIMEOUT" in build_parser().format_help()


def test_metrics_textfile_from_flag_or_environment() -> None:
    env = {"CAPSULE_HOME": "/x"}
    assert parse_args([], env).metrics_textfile is None
    from_env = parse_args([], {**env, "CAPSULED_METRICS_TEXTFILE": "/var/lib/node/capsuled.prom"})
    assert from_env.metrics_textfile == Path("/var/lib/node/capsuled.prom")
    flagged = parse_args(
        ["--metrics-textfile", "m/capsuled.prom"], {**env, "CAPSULED_METRICS_TEXTFILE": "/a.prom"}
    )
    assert flagged.metrics_textfile == Path.cwd() / "m/capsuled.prom"  # made absolute
    with pytest.raises(ConfigError, match=r"\.prom"):
        parse_args(["--metrics-textfile", "/tmp/capsuled.txt"], env)


def test_help_names_the_metrics_textfile_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"], {})
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--metrics-textfile PATH" in help_text
    assert "[$CAPSULED_METRICS_TEXTFILE]" in help_text
    # The interval the help gives is the writer's own (docs/design.md §8: 2 s).
    assert "at most every 2 s" in help_text
    assert TEXTFILE_MIN_INTERVAL_S == 2.0
    writer = TextfileWriter(Path("m.prom"), CollectorRegistry())
    assert writer.min_interval_s == TEXTFILE_MIN_INTERVAL_S
