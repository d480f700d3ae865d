"""What every room may use: the shortage classifier and the task host.

Offers :mod:`.shortage` (whether an ``OSError`` says the daemon, not the
file, is short of a resource — docs/design.md §8 "Out of descriptors") and
:mod:`.tasks` (``TaskHost``: a service that runs its own tasks in a task
group of its own).

May import: nothing of capsuled; it is the bottom layer.
"""
