"""Closing the Faust apps the unit tests build (never started, no broker), and the guard that
each Faust test file leaves no descriptors open.

An app that never started is never stopped, so nothing of Faust's shutdown runs for it: its
consumer thread's event loop (an epoll and a socket pair: mode creates the loop with the thread
and closes it only when the thread ran), its ``<appdir>/streamassign/.lock`` and every RocksDB
partition its tables opened stay open until the garbage collector frees the app, at best after
its test. While Faust's class-level signals held our receivers strongly that never happened:
over 1,100 descriptors after the Faust tests, and a later test's pipe above 1024 broke
``select.select``. Closing each app after its test releases them at once.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import faust
import pytest

#: Descriptors a Faust test file may leave open (a log file, a cache a library opens once).
SPARE_DESCRIPTORS = 8


def close_app(app: faust.App) -> None:
    """Release what ``app`` holds, as a stopping worker does: its assignor's state directory
    (the assignor closes it on ``on_before_shutdown``, which Faust sends when an app stops), its
    tables' RocksDB partitions and its consumer thread's event loop."""
    asyncio.run(app.on_before_shutdown.send())
    for table in app.tables.values():
        data = table._data
        storage = getattr(data, "_storage", None)  # a set table's store: ``data.storage``
        _close_rocksdb(data if storage is None else storage)
    consumer = app._consumer
    if consumer is not None:
        _close_unstarted_thread_loop(getattr(consumer, "_thread", None))


def _close_rocksdb(store: Any) -> None:
    """Faust's RocksDB store only drops its handles when it stops (the GC closes them); the
    app here stays reachable, so they are closed as the tests' restarts close them."""
    handles = getattr(store, "_dbs", None)
    if not handles:
        return
    for db in handles.values():
        db.close()
    handles.clear()


def _close_unstarted_thread_loop(thread: Any) -> None:
    """mode's ServiceThread closes the loop it created when its thread ends; a thread never
    started leaves it open."""
    if thread is None or thread._thread is not None:
        return
    loop = thread.thread_loop
    if not loop.is_closed() and not loop.is_running():
        loop.close()


@contextmanager
def apps_closed_after() -> Iterator[list[faust.App]]:
    """Every ``faust.App`` built inside the block (by a test, a helper or a fixture), closed at
    its end."""
    built: list[faust.App] = []
    init = faust.App.__init__

    def recorded_init(self: faust.App, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        built.append(self)  # one that failed to build holds nothing to close

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(faust.App, "__init__", recorded_init)
        try:
            yield built
        finally:
            patch.undo()
            for app in built:
                close_app(app)


def open_descriptors() -> int | None:
    """How many descriptors this process holds (None where ``/proc`` does not say)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def descriptors_left(before: int | None) -> int | None:
    """Descriptors opened since ``before`` and still open once the garbage is collected."""
    gc.collect()
    after = open_descriptors()
    return None if before is None or after is None else after - before
