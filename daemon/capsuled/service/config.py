"""The daemon's configuration: flags, their environment variables, defaults (docs/design.md §8).

A flag wins over its environment variable, which wins over the default.
Every flag and variable is listed in ``capsuled --help`` and in docs/design.md §8.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Literal, get_args

from capsule_client.kit.paths import MAX_SOCKET_PATH_BYTES, default_home, default_socket
from capsule_client.wire import WatcherMode
from capsuled import __version__
from capsuled.discovery.sampler import DEFAULT_SAMPLE_INTERVAL_S
from capsuled.discovery.verification_runs import DEFAULT_VERIFY_INTERVAL_S
from capsuled.metrics.textfile import TEXTFILE_MIN_INTERVAL_S
from capsuled.processes.exits import DEFAULT_MAX_PIDFDS
from capsuled.rpc.server import DEFAULT_MAX_CONNECTIONS, DEFAULT_WRITE_TIMEOUT_S
from capsuled.watch.watcher import DEFAULT_POLL_INTERVAL_S, WATCH_MODES

__all__ = ["Config", "ConfigError", "parse_args"]

LogFormat = Literal["json", "console", "auto"]
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
#: What the daemon does unless told otherwise (the numbers' defaults live with
#: the service that uses them, and are imported above).
DEFAULT_LOG_FORMAT: Final[LogFormat] = "auto"
DEFAULT_LOG_LEVEL: Final = "info"
DEFAULT_WATCH: Final[WatcherMode] = "native"


class ConfigError(ValueError):
    """A flag or environment variable has a value the daemon cannot use.

    The message starts with the flag or the variable the value came from
    (``CAPSULED_VERIFY_INTERVAL: verify interval must be …``).

    Attributes:
        option: the option the value is for (``verify_interval``), None when unknown.
    """

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the daemon was told at start-up.

    Attributes:
        home: the home directory (docs/design.md §2), absolute.
        socket: the Unix socket path, absolute.
        sample_interval_s: seconds between two observations of the sampler.
        verify_interval_s: seconds between two verification runs (the net
            under the watch, docs/design.md §5).
        poll_interval_s: seconds between two poll passes while polling, and
            between two retries of a directory the native watch could not watch.
        log_format: ``json``, ``console``, or ``auto`` (console on a TTY
            that is not the journal, JSON otherwise).
        log_level: lowest level logged, lower case.
        max_connections: connections served at once; more get -32002.
        drain_timeout_s: how long a shutdown waits for in-flight requests.
        write_timeout_s: how long a reply may wait for its peer to read it
            before the connection is dropped (docs/protocol.md, "Slow readers").
        watch: how the home is watched: ``native`` (falls back to polling
            when a native watch cannot start), ``polling`` or ``off``.
        max_pidfds: process-exit descriptors held at most; the exits of
            processes past it are noticed by sampling (``capsuled.processes.exits``).
        metrics_textfile: where to write the metrics for node_exporter's
            textfile collector (docs/service.md), or None.
    """

    home: Path
    socket: Path
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S
    verify_interval_s: float = DEFAULT_VERIFY_INTERVAL_S
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    log_format: LogFormat = DEFAULT_LOG_FORMAT
    log_level: str = DEFAULT_LOG_LEVEL
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    drain_timeout_s: float = 5.0
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    watch: WatcherMode = DEFAULT_WATCH
    max_pidfds: int = DEFAULT_MAX_PIDFDS
    metrics_textfile: Path | None = None


# (flag, environment variable, help) for the options that have one.
_ENV = {
    "home": "CAPSULE_HOME",
    "socket": "CAPSULED_SOCKET",
    "sample_interval": "CAPSULED_SAMPLE_INTERVAL",
    "verify_interval": "CAPSULED_VERIFY_INTERVAL",
    "poll_interval": "CAPSULED_POLL_INTERVAL",
    "log_format": "CAPSULED_LOG_FORMAT",
    "log_level": "CAPSULED_LOG_LEVEL",
    "max_connections": "CAPSULED_MAX_CONNECTIONS",
    "write_timeout": "CAPSULED_WRITE_TIMEOUT",
    "watch": "CAPSULED_WATCH",
    "max_pidfds": "CAPSULED_MAX_PIDFDS",
    "metrics_textfile": "CAPSULED_METRICS_TEXTFILE",
}


def _positive_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, not {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"{name} must be a positive number of seconds, not {text!r}")
    return value


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {text!r}") from None
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, not {text!r}")
    return value


#: (option, Config field, conversion) for the numeric options.
_NUMBERS: tuple[tuple[str, str, Callable[[str, str], object]], ...] = (
    ("sample_interval", "sample_interval_s", _positive_float),
    ("verify_interval", "verify_interval_s", _positive_float),
    ("poll_interval", "poll_interval_s", _positive_float),
    ("write_timeout", "write_timeout_s", _positive_float),
    ("max_connections", "max_connections", _positive_int),
    ("max_pidfds", "max_pidfds", _positive_int),
)


def build_parser() -> argparse.ArgumentParser:
    """The ``capsuled`` command line; each option's help names its variable."""
    parser = argparse.ArgumentParser(
        prog="capsuled",
        description=(
            "Per-user daemon that tells agent runtimes which sessions are alive, with which "
            "processes, and which background commands a resumed session left behind. "
            "It serves JSON-RPC 2.0, one message per line, on a Unix socket."
        ),
        epilog=(
            "Each option can also be set by the environment variable in brackets; the flag "
            "wins. Exit status: 0 after a clean shutdown (SIGTERM, SIGINT), 1 when the daemon "
            "cannot start (bad home, socket in use), 2 on bad usage."
        ),
    )

    def add(flag: str, key: str, help_text: str, **kwargs: object) -> None:
        parser.add_argument(flag, dest=key, help=f"{help_text} [${_ENV[key]}]", **kwargs)  # type: ignore[arg-type]

    add(
        "--home",
        "home",
        "directory runtimes write receipts into "
        "(default: $XDG_STATE_HOME/capsule, else ~/.local/state/capsule)",
        metavar="DIR",
    )
    add(
        "--socket",
        "socket",
        "Unix socket to serve (default: $XDG_RUNTIME_DIR/capsuled.sock, else HOME/capsuled.sock)",
        metavar="PATH",
    )
    add(
        "--sample-interval",
        "sample_interval",
        "seconds between two observations where changes cannot all be events: no watch, "
        "process exits past the pidfd limit or without pidfds "
        f"(default: {DEFAULT_SAMPLE_INTERVAL_S:g})",
        metavar="S",
    )
    add(
        "--verify-interval",
        "verify_interval",
        "seconds between two verification runs, which compare every receipt directory and "
        "live receipt with what was last seen and re-read what the watch missed "
        f"(default: {DEFAULT_VERIFY_INTERVAL_S:g})",
        metavar="S",
    )
    add(
        "--poll-interval",
        "poll_interval",
        "seconds between two passes of the polling watch, and between two retries of a "
        f"directory the native watch could not watch (default: {DEFAULT_POLL_INTERVAL_S:g})",
        metavar="S",
    )
    add(
        "--log-format",
        "log_format",
        "json, console, or auto: console on a terminal, JSON otherwise "
        f"(default: {DEFAULT_LOG_FORMAT})",
        metavar="FORMAT",
    )
    add(
        "--log-level",
        "log_level",
        f"debug, info, warning, error or critical (default: {DEFAULT_LOG_LEVEL})",
        metavar="LEVEL",
    )
    add(
        "--max-connections",
        "max_connections",
        "connections served at once; more are answered -32002 and closed "
        f"(default: {DEFAULT_MAX_CONNECTIONS})",
        metavar="N",
    )
    add(
        "--write-timeout",
        "write_timeout",
        "seconds a reply may wait for the client to read it before the connection is "
        f"dropped (default: {DEFAULT_WRITE_TIMEOUT_S:g})",
        metavar="S",
    )
    add(
        "--watch",
        "watch",
        "how to watch the home for changes: native (inotify on Linux, FSEvents on macOS; falls "
        "back to polling when it cannot start), polling (an lstat walk every poll interval), "
        f"or off (no watch: every observation walks the home) (default: {DEFAULT_WATCH})",
        metavar="MODE",
    )
    add(
        "--max-pidfds",
        "max_pidfds",
        "processes whose exit is watched with a pidfd (Linux >= 5.3), so it changes answers "
        f"at once; the exits of more are noticed by sampling (default: {DEFAULT_MAX_PIDFDS})",
        metavar="N",
    )
    add(
        "--metrics-textfile",
        "metrics_textfile",
        "also write the metrics to this file (atomically, after changes, at most every "
        f"{TEXTFILE_MIN_INTERVAL_S:g} s) for node_exporter's textfile collector; the name must "
        "end in .prom (default: none)",
        metavar="PATH",
    )
    parser.add_argument("--version", action="version", version=f"capsuled {__version__}")
    return parser


def parse_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> Config:
    """Turn the command line and the environment into a :class:`Config`.

    Raises:
        ConfigError: a value is out of range or malformed (message names it).
        SystemExit: ``--help``, ``--version`` or a usage error (argparse).
    """
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    said: dict[str, str] = {}  # option -> where its value was given: the flag or the variable

    def pick(key: str) -> str | None:
        value: str | None = getattr(args, key)
        said[key] = "--" + key.replace("_", "-")
        if value is None:
            value = env.get(_ENV[key]) or None
            said[key] = _ENV[key]
        return value

    try:
        return _config(pick, env)
    except ConfigError as exc:
        if exc.option is None:
            raise
        raise ConfigError(f"{said[exc.option]}: {exc}", exc.option) from None


def _config(pick: Callable[[str], str | None], env: Mapping[str, str]) -> Config:
    """:func:`parse_args` once the values are picked; a :class:`ConfigError` carries the
    message and the option it is about."""
    home_text = pick("home")
    home = Path(home_text).expanduser() if home_text else default_home(env)
    home = Path(os.path.abspath(home))
    socket_text = pick("socket")
    socket = Path(socket_text).expanduser() if socket_text else default_socket(home, env)
    socket = Path(os.path.abspath(socket))

    log_format = (pick("log_format") or DEFAULT_LOG_FORMAT).lower()
    if log_format not in get_args(LogFormat):
        raise ConfigError(
            f"log format must be json, console or auto, not {log_format!r}", "log_format"
        )
    log_level = (pick("log_level") or DEFAULT_LOG_LEVEL).lower()
    if log_level not in LOG_LEVELS:
        raise ConfigError(
            f"log level must be one of {', '.join(LOG_LEVELS)}, not {log_level!r}", "log_level"
        )

    watch = (pick("watch") or DEFAULT_WATCH).lower()
    if watch not in WATCH_MODES:
        raise ConfigError(f"watch must be one of {', '.join(WATCH_MODES)}, not {watch!r}", "watch")

    textfile_text = pick("metrics_textfile")
    textfile = Path(os.path.abspath(Path(textfile_text).expanduser())) if textfile_text else None
    if textfile is not None and textfile.suffix != ".prom":
        raise ConfigError(
            f"metrics textfile must end in .prom (node_exporter reads only those), not {textfile}",
            "metrics_textfile",
        )

    config = Config(home=home, socket=socket, log_format=log_format, log_level=log_level)  # type: ignore[arg-type]
    overrides: dict[str, object] = {"watch": watch, "metrics_textfile": textfile}
    for key, field, convert in _NUMBERS:
        if (text := pick(key)) is not None:
            try:
                overrides[field] = convert(key.replace("_", " "), text)
            except ConfigError as exc:
                raise ConfigError(str(exc), key) from None
    if len(os.fsencode(socket)) > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(
            f"socket path {socket} is longer than the {MAX_SOCKET_PATH_BYTES} bytes "
            "a Unix socket allows; choose a shorter --socket",
            "socket" if socket_text else None,  # else made of the home or $XDG_RUNTIME_DIR
        )
    return replace(config, **overrides)  # type: ignore[arg-type]
