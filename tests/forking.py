"""A snippet for the tests that run a forking process's hooks in a process of their own
(tests/test_webserver.py, tests/test_worker_fork.py): garbage of the moment, a cycle only the
collector frees, and `gone()`, true once it is freed. A hook that freezes without collecting
first keeps it for ever."""

from __future__ import annotations

GARBAGE_OF_THE_MOMENT = """
import weakref
class Node:
    pass
node = Node()
node.me = node
gone = weakref.ref(node)
del node
"""
