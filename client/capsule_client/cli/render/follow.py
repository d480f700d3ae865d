"""Following the daemon until interrupted: ``capsulectl watch`` and ``capsulectl top``.

Both outlive a daemon restart: they reconnect, and start again from the whole
answer (docs/design.md §9). Both end quietly on Ctrl-C and when the reader of
their output goes away (``| head``).
"""

from __future__ import annotations

import sys
import time
from typing import Final, TextIO

from ...client import Client
from ...errors import (
    ConnectionLost,
    DaemonNotRunning,
    Overloaded,
    RequestTimeout,
    ShuttingDown,
    SubscriptionDropped,
)
from ...wire import ActiveSessionsSnapshot
from ..exits import EXIT_OK, EXIT_REMOTE_ERROR
from .output import quiet_stdout, say_unsettled
from .tables import JSON_ENCODER, ChangePrinter, render_top
from .tree import terminal_width

__all__ = ["WATCH_RECONNECT_INTERVAL_S", "follow_changes", "follow_top"]

#: Seconds between two attempts to reach a daemon that went away under ``watch``.
WATCH_RECONNECT_INTERVAL_S: Final = 0.2

#: What ends a ``watch`` or ``top`` connection without ending the command: the
#: daemon restarting, or too busy to take the connection (-32002) for now.
_RECONNECT_ON: Final = (ConnectionLost, DaemonNotRunning, ShuttingDown, Overloaded)


def follow_changes(client: Client, out: TextIO, *, json_lines: bool, wide: bool = False) -> int:
    """Print every ``sessions.changed`` notification until interrupted (``capsulectl watch``).

    A daemon that goes away after the first answer (a restart, an upgrade)
    does not end the watch: it reconnects, and the new subscription starts
    with the whole answer again (``full``). A first answer that is not
    ``ready`` is said on stderr, and the watch ends with exit status 1 (without
    ``json_lines``); a later one is shown as what is wrong, and the watch goes on.

    Returns:
        The exit status: 0 when interrupted, 1 when the first answer was not ``ready``.

    Raises:
        DaemonNotRunning: no daemon answered the first subscription (exit
            status 3, as for every other command).
    """
    width = None if wide else terminal_width(out)
    printer = ChangePrinter(json_lines=json_lines, width=width, wide=wide)
    answered = False
    try:
        while True:
            try:
                for change in client.subscribe(commands=True):
                    if not answered and not json_lines:
                        if say_unsettled(change.discovery, change.gaps):
                            return EXIT_REMOTE_ERROR
                    answered = True
                    out.write(printer.render(change))
                    out.flush()
            except SubscriptionDropped as exc:
                # The next subscription starts with the whole answer again.
                print(f"capsulectl: {exc}; subscribing again", file=sys.stderr)
            except _RECONNECT_ON as exc:
                if not answered:
                    raise
                print(f"capsulectl: {exc}; reconnecting", file=sys.stderr)
                _wait_for_daemon(client)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:  # `capsulectl watch | head`
        quiet_stdout(out)
        return EXIT_OK


def _wait_for_daemon(client: Client) -> None:
    """Ping until a daemon answers on the client's socket (for ever: Ctrl-C ends it)."""
    while True:
        try:
            client.ping()
            return
        except (*_RECONNECT_ON, RequestTimeout):
            time.sleep(WATCH_RECONNECT_INTERVAL_S)


def _snapshot_again(client: Client) -> ActiveSessionsSnapshot:
    """``top``'s first answer from a daemon that came back (it may go away again meanwhile)."""
    while True:
        _wait_for_daemon(client)
        try:
            return client.snapshot(usage=True, commands=True)
        except _RECONNECT_ON:
            continue


def follow_top(
    client: Client,
    out: TextIO,
    *,
    interval_s: float,
    once: bool,
    json: bool,
    wide: bool = False,
) -> int:
    """Print the ``usage: true`` table, again on every change or every ``interval_s``.

    ``once``: one table, CPU measured over ``interval_s`` (at most 1 s). A table
    shown on a terminal replaces the previous one; ``json`` prints the snapshot
    as one JSON document instead. Each row is cut to the terminal's width
    (``wide``: whole, with the receipts' ids and paths). A first answer (with
    ``once``, the answer) that is not ``ready`` is said on stderr instead
    (without ``json``); a later one is shown as what is wrong, and ``top`` goes on.

    Returns:
        The exit status: 0, or 1 when the first answer was not ``ready``.
    """
    interval_s = max(interval_s, 0.05)
    clear = not once and out.isatty()
    try:
        snapshot = client.snapshot(usage=True, fresh=once, commands=True)
        if once:  # CPU use is measured between two looks; the last one reads your writes
            time.sleep(min(interval_s, 1.0))
            snapshot = client.snapshot(usage=True, fresh=True, commands=True)
        if not json and say_unsettled(snapshot.discovery, snapshot.gaps):
            return EXIT_REMOTE_ERROR
        while True:
            if json:
                text = JSON_ENCODER.encode(snapshot).decode()
            else:
                width = None if wide else terminal_width(out)  # the terminal may be resized
                text = render_top(snapshot, width=width, wide=wide)
            out.write(("\x1b[H\x1b[2J" if clear else "") + text + "\n")
            out.flush()
            if once:
                return EXIT_OK
            try:
                # Wakes at once when the answer changes, else after the interval.
                snapshot = client.snapshot(
                    usage=True,
                    since=snapshot.generation,
                    timeout_ms=round(interval_s * 1000),
                    commands=True,
                )
            except _RECONNECT_ON as exc:
                # A restart: the new daemon's generations start elsewhere.
                print(f"capsulectl: {exc}; reconnecting", file=sys.stderr)
                snapshot = _snapshot_again(client)
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        quiet_stdout(out)
        return EXIT_OK
