"""CMD for the terminal tests of `capsulectl run`: says what it sees and what reaches it.

Prints ``ready PID PPID tty=<stdin, stdout a TTY> fg=<its group in the foreground>
size ROWS COLS``, then one line per signal caught (``got NAME``; ``size ROWS COLS``
after a resize), and obeys lines on stdin: ``exit N``, ``kill N`` (signal itself
with the default action restored), ``size``.
"""

from __future__ import annotations

import os
import signal
import sys


def say(text: str) -> None:
    os.write(1, (text + "\r\n").encode())


def size() -> str:
    columns, rows = os.get_terminal_size(1)
    return f"size {rows} {columns}"


def caught(signum: int, frame: object) -> None:
    say(size() if signum == signal.SIGWINCH else f"got {signal.Signals(signum).name[3:]}")


def main() -> None:
    default_int = "--default-int" in sys.argv
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGCONT, signal.SIGWINCH):
        signal.signal(signum, caught)
    if not default_int:
        signal.signal(signal.SIGINT, caught)
    fg = os.tcgetpgrp(1) == os.getpgrp()
    say(f"ready {os.getpid()} {os.getppid()} tty={os.isatty(0)},{os.isatty(1)} fg={fg} {size()}")
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "exit":
            sys.exit(int(arg))
        if word == "kill":
            if int(arg) not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(int(arg), signal.SIG_DFL)
            os.kill(os.getpid(), int(arg))
        if word == "size":
            say(size())


if __name__ == "__main__":
    main()
