"""The launcher's process work: CMD in its own process group with the terminal, signals
forwarded, job control passed on, every adopted orphan reaped (docs/design.md §10).

One object, :class:`Launch`, runs one CMD. Signals are caught by handlers that do
nothing but wake the loop (``signal.set_wakeup_fd``): the loop reads the signal
numbers from a pipe and acts on them in order, so no work runs inside a handler.
Caught signals are reset to their defaults by ``execve``; CMD inherits no mask.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

__all__ = ["FORWARDED", "Launch", "Terminal", "exit_code", "make_subreaper"]

#: Signals sent to the launcher that it passes on to CMD (docs/design.md §10).
FORWARDED: Final = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGWINCH,
)
#: ``prctl`` option: orphans of the caller's tree are re-parented to it (Linux ≥ 3.4).
PR_SET_CHILD_SUBREAPER: Final = 36


def make_subreaper() -> str | None:
    """Make this process a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER, 1)``).

    Returns ``None`` when it is one, else why not (not Linux, or the call failed).
    The attribute is not inherited by children: call it in the process that stays.
    """
    if not sys.platform.startswith("linux"):
        return f"{sys.platform} has no child subreaper"
    import ctypes  # only here: it costs every other command its import

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    return None


def exit_code(status: int) -> int:
    """A wait status as a shell's exit status: the exit code, or 128 + N for signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


@contextlib.contextmanager
def _blocked(signum: int) -> Iterator[None]:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Terminal:
    """The launcher's stdin when it is the controlling terminal, else none.

    Only a launcher whose stdin is the terminal hands the terminal to CMD: a runtime
    that starts it with another stdin (a pipe, ``/dev/null``) keeps its terminal,
    as a shell without job control would.
    """

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            if os.isatty(0):
                os.tcgetpgrp(0)  # ENOTTY unless it is this process's controlling terminal
                self.fd = 0
        except OSError:
            pass

    def foreground(self) -> int | None:
        """The terminal's foreground process group, or ``None`` without a terminal."""
        if self.fd is None:
            return None
        try:
            return os.tcgetpgrp(self.fd)
        except OSError:  # the terminal hung up
            return None

    def give(self, pgrp: int) -> None:
        """Make ``pgrp`` the foreground group (``SIGTTOU`` blocked: allowed from the
        background, as shells do)."""
        if self.fd is None:
            return
        with _blocked(signal.SIGTTOU), contextlib.suppress(OSError):
            os.tcsetpgrp(self.fd, pgrp)


def _child_setup(tty_fd: int | None) -> Callable[[], None]:
    """What CMD's process does between fork and exec: a process group of its own, made
    the terminal's foreground group when ``tty_fd`` is given (the parent does it too, so
    neither order of the two races)."""

    def setup() -> None:
        signal.set_wakeup_fd(-1)
        os.setpgid(0, 0)
        if tty_fd is not None:
            with _blocked(signal.SIGTTOU), contextlib.suppress(OSError):
                os.tcsetpgrp(tty_fd, os.getpid())

    return setup


class Launch:
    """Run CMD as the terminal would run it directly, forwarding and reaping (§10).

    Args:
        argv: CMD and its arguments, looked up on ``PATH``.
        env: CMD's environment.
        terminal: the launcher's terminal; CMD gets its foreground only when the
            launcher's process group has it.

    Raises (from :meth:`start`):
        OSError: CMD could not be started (``FileNotFoundError``, ``PermissionError``...).
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], terminal: Terminal) -> None:
        self._argv = list(argv)
        self._env = dict(env)
        self._terminal = terminal
        self._pgrp = os.getpgrp()
        self._given = False  # CMD's group has the terminal because the launcher gave it
        self._process: subprocess.Popen[bytes] | None = None
        self.status: int | None = None  # CMD's wait status once reaped
        self.reaped = 0  # adopted processes reaped
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old: dict[int, object] = {}
        for signum in (*FORWARDED, signal.SIGCHLD):
            self._old[signum] = signal.signal(signum, _wake_only)
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

    @property
    def pid(self) -> int | None:
        """CMD's pid once started."""
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Start CMD (in its own process group; with the terminal's foreground if ours)."""
        give = self._terminal.fd is not None and self._terminal.foreground() == self._pgrp
        self._process = subprocess.Popen(
            self._argv,
            env=self._env,
            preexec_fn=_child_setup(self._terminal.fd if give else None),
        )
        with contextlib.suppress(OSError):  # it may have exec'd already (EACCES)
            os.setpgid(self._process.pid, self._process.pid)
        if give:
            self._terminal.give(self._process.pid)
            self._given = True

    def wait(self) -> int:
        """Forward signals and reap until CMD has exited; its wait status."""
        self._reap()
        while self.status is None:
            for signum in self._signals(None):
                if signum == signal.SIGCHLD:
                    self._reap()
                elif self.status is None and self._process is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self._process.pid, signum)
        self._take_terminal_back()
        return self.status

    def wait_for_tree(self) -> bool:
        """Reap until the launcher has no child left: every process of its tree has exited
        (a subreaper adopts each orphan of it). False if HUP, INT or TERM ended the wait."""
        while self.children():
            for signum in self._signals(None):
                if signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
                    return False
        return True

    def children(self) -> bool:
        """Whether the launcher still has a child (reaping every one that has exited)."""
        while True:
            self._reap()
            try:  # WNOWAIT: one that exits meanwhile is reaped by the next _reap, not here
                if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                    return True
            except ChildProcessError:
                return False

    def close(self) -> None:
        """Restore the signal handlers and the wake-up fd; close the pipe."""
        signal.set_wakeup_fd(self._old_wakeup)
        for signum, handler in self._old.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------------

    def _signals(self, timeout_s: float | None) -> bytes:
        """The signal numbers caught since the last call (waits up to ``timeout_s``)."""
        select.select([self._wake_r], [], [], timeout_s)
        try:
            return os.read(self._wake_r, 4096)
        except BlockingIOError:
            return b""

    def _reap(self) -> None:
        """Collect every child that changed state: CMD's exit or stop, adopted exits."""
        cmd = None if self._process is None else self._process.pid
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid != cmd or self.status is not None:
                if not os.WIFSTOPPED(status):
                    self.reaped += 1
            elif os.WIFSTOPPED(status):
                self._stopped(os.WSTOPSIG(status))
            else:
                self.status = status
                assert self._process is not None
                self._process.returncode = exit_code(status)  # Popen must not wait for it

    def _stopped(self, signum: int) -> None:
        """CMD stopped (Ctrl-Z, a read from the background): stop the launcher with the
        same signal, as ``sudo`` does, so the shell above sees its job stopped; when it is
        continued (``fg``, ``bg``), give CMD the terminal back if ours and continue it."""
        assert self._process is not None
        if self._given:
            self._terminal.give(self._pgrp)
            self._given = False
        # A stop from the terminal is discarded by the kernel for an orphaned process
        # group (no shell to continue it); CMD is then continued at once.
        os.kill(os.getpid(), signum)
        if self._terminal.fd is not None and self._terminal.foreground() == self._pgrp:
            self._terminal.give(self._process.pid)
            self._given = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGCONT)

    def _take_terminal_back(self) -> None:
        if self._given:
            self._terminal.give(self._pgrp)
            self._given = False


def _wake_only(signum: int, frame: object) -> None:
    """A handler that does nothing: the wake-up fd carries the signal to the loop."""
