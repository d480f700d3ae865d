"""The home: its layout and its strictness, the facts every room shares (docs/design.md §2, §3).

Offers :mod:`.layout` (the one classifier: which directories are entered,
which paths are receipts, used by the watch and the reader alike, and the
racy window of the home's file timestamps) and
:mod:`.strictness` (which homes capsuled refuses, and why).

May import: nothing of capsuled; it is the bottom layer.
"""
