"""--write-timeout / CAPSULED_WRITE_TIMEOUT (docs/protocol.md, "Slow readers")."""

from __future__ import annotations

import pytest

from capsuled.config import ConfigError, build_parser, parse_args


def test_write_timeout_flag_beats_environment_beats_default() -> None:
    assert parse_args(["--home", "/h"], {}).write_timeout_s == 10.0
    env = {"CAPSULED_WRITE_TIMEOUT": "2.5"}
    assert parse_args(["--home", "/h"], env).write_timeout_s == 2.5
    assert parse_args(["--home", "/h", "--write-timeout", "0.25"], env).write_timeout_s == 0.25


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_write_timeout_is_named(value: str) -> None:
    with pytest.raises(ConfigError, match="write timeout"):
        parse_args(["--home", "/h", "--write-timeout", value], {})


def test_help_names_the_variable() -> None:
    assert "CAPSULED_WRITE_TIMEOUT" in build_parser().format_help()
