"""Helpers the test suite shares, one module per job, imported as ``helpers.<module>``.

* ``daemon``: the real daemon (:class:`DaemonProcess`), short socket paths, raw exchanges;
* ``waits``: deadlines instead of sleeps (:func:`wait_until`, :class:`ChildOutput`);
* ``processes``: real processes started and killed (``Processes``, ``Sleepers``);
* ``world``: a home with an in-process reader, the store and sleepers (``World``);
* ``asking``: plain snapshots, a long poll and a subscription watched at once;
* ``run``, ``mcp_sessions``, ``demo``: what the ``capsulectl run``, ``capsulectl mcp``
  and demo tests share;
* ``trust``, ``reliability``, ``kept_writer``, ``userns``: a home under adversity, the
  reliability sizes and figures, a stalled store writer, a user namespace's inotify limits;
* ``doc_blocks``: the marked blocks of the docs;
* ``messages_api``, ``claude_code``, ``hook_recorder``, ``mcp_recorder``: stand-ins for
  services and drivers for the real Claude Code.

The reference models the tests compare the daemon with are in ``tests/models/``.
"""
