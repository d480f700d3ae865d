"""Reference models the tests compare the daemon with, sharing no code with it.

* ``rpc_model``: the wire protocol, from docs/design.md §7 and docs/protocol.md:
  which replies, codes and closes any bytes a client sends must get.
* ``reader_model``: the reader, a home's snapshot computed slowly and from
  scratch (docs/design.md §2, §3, §5).
"""
