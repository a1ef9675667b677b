"""What a forked child (multiprocessing's ``fork`` start method) must not inherit.

A child forked from a process with threads gets a copy of every module's registries and
locks but none of the threads: a registry entry refers to work a parent's thread does (or
to the parent's consumers), and a lock a parent's thread held at the fork stays held in
the child for ever. A module that keeps such per-process state marks the function that
gives the child fresh state with :func:`in_forked_child`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["in_forked_child"]


def in_forked_child(reset: Callable[[], None]) -> Callable[[], None]:
    """Decorator: run ``reset`` in each child this process forks, right after the fork
    (``os.register_at_fork(after_in_child=...)``; nothing where the platform has no fork).
    Returns ``reset`` unchanged."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=reset)
    return reset
