"""A value the daemon cannot use is named by where it was given: the flag, or the
environment variable (docs/design.md §8, "Command line")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from capsuled.service.config import ConfigError, parse_args


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("CAPSULED_VERIFY_INTERVAL", "abc", "verify interval must be a number of seconds"),
        ("CAPSULED_SAMPLE_INTERVAL", "0", "sample interval must be a positive number"),
        ("CAPSULED_MAX_PIDFDS", "many", "max pidfds must be a whole number"),
        ("CAPSULED_WATCH", "inotify", "watch must be one of native, polling, off"),
        ("CAPSULED_LOG_FORMAT", "xml", "log format must be json, console or auto"),
        ("CAPSULED_LOG_LEVEL", "loud", "log level must be one of"),
        ("CAPSULED_METRICS_TEXTFILE", "/tmp/m.txt", "must end in .prom"),
        ("CAPSULED_SOCKET", "/" + "s" * 120, "107 bytes"),
    ],
)
def test_a_bad_variable_is_named_and_so_is_a_bad_flag(variable: str, value: str, said: str) -> None:
    env = {"CAPSULE_HOME": "/h", variable: value}
    with pytest.raises(ConfigError) as caught:
        parse_args([], env)
    assert str(caught.value).startswith(f"{variable}: "), caught.value
    assert said in str(caught.value)
    flag = "--" + variable.removeprefix("CAPSULED_").lower().replace("_", "-")
    with pytest.raises(ConfigError) as caught:
        parse_args([flag, value], {"CAPSULE_HOME": "/h"})
    assert str(caught.value).startswith(f"{flag}: "), caught.value
    # The flag wins, and a good flag leaves a bad variable unread.
    good = "/tmp/m.prom" if variable.endswith("TEXTFILE") else "/tmp/s.sock"
    good = {"CAPSULED_WATCH": "polling", "CAPSULED_LOG_FORMAT": "json"}.get(variable, good)
    good = {"CAPSULED_LOG_LEVEL": "debug", "CAPSULED_MAX_PIDFDS": "8"}.get(variable, good)
    if "INTERVAL" in variable:
        good = "2"
    parse_args([flag, good], env)


def test_a_socket_made_of_the_runtime_directory_is_not_blamed_on_a_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_args([], {"CAPSULE_HOME": "/h", "XDG_RUNTIME_DIR": "/" + "r" * 120})
    assert str(caught.value).startswith("socket path /rrr"), caught.value


def test_the_daemon_says_which_variable_and_exits_2() -> None:
    env = {**os.environ, "CAPSULED_VERIFY_INTERVAL": "abc"}
    done = subprocess.run(
        [sys.executable, "-m", "capsuled", "--home", "/nonexistent/h"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "capsuled: CAPSULED_VERIFY_INTERVAL: verify interval must be a number of seconds, "
        "not 'abc'\n"
    )
