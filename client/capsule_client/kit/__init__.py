"""The writer kit, for runtimes: what a runtime writes so that capsuled knows its
sessions (docs/design.md §3, §4, §6, §9, §10).

* :mod:`.paths`: where the home, the socket and the store are (§2);
* :mod:`.receipts`: the receipt formats, and writing one atomically with the
  start time read from the OS (§3);
* :mod:`.proc`: the one ``/proc/<pid>/stat`` parser, this boot's id, and a
  process's start with its exact identity (§3 "Liveness", §14);
* :mod:`.store`: the ownership store's schema and writer (§4);
* :mod:`.trace_format`: the trace's lines, the event ids and times (§6);
* :mod:`.trace`: the trace's lock and appends, and ``TraceWriter`` (§6);
* :mod:`.launcher`: ``spawn``, a command started under ``capsulectl run``, and the
  launcher's rows in the store (§10); :mod:`.launch`, the launcher's own process work.

The daemon reads the same formats through these modules, so each is written down
once. Nothing here needs psutil or the daemon.

What it may import: msgspec, uuid-utils and the standard library; nothing else of
the package but :mod:`capsule_client.wire` (the daemon imports it, docs/design.md §1).
"""
