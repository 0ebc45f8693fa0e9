"""Waiting for a pipe to have something to read, with a deadline, on any file descriptor.

``select.select`` refuses descriptors of 1024 and above ("filedescriptor out of range in
select()"), and a test run in one process with others that leave files open (the Faust tests'
RocksDB handles) gets such descriptors for its own pipes; a selector (epoll or poll) has no
such limit."""

from __future__ import annotations

import selectors
from typing import IO


def readable_within(source: int | IO[str] | IO[bytes], seconds: float) -> bool:
    """Whether ``source`` (a file descriptor or an open file) has something to read (or its
    end, EOF) within ``seconds``."""
    with selectors.DefaultSelector() as selector:
        selector.register(source, selectors.EVENT_READ)
        return bool(selector.select(timeout=max(seconds, 0.0)))
