"""Waiting for a pipe to have something to read, with a deadline, on any file descriptor.

``select.select`` refuses descriptors of 1024 and above ("filedescriptor out of range in
select()"), and a test run in one process after others that leave files open (the Faust
tests leave event loops and state-directory locks open: over 1,100 descriptors after all of
them) gets such descriptors for its own pipes. ``poll`` has no such limit, and unlike epoll it
takes any file (epoll refuses regular files)."""

from __future__ import annotations

import selectors
from typing import IO


def readable_within(source: int | IO[str] | IO[bytes], seconds: float) -> bool:
    """Whether ``source`` (a file descriptor or an open file) has something to read (or its
    end, EOF) within ``seconds``."""
    with selectors.PollSelector() as selector:
        selector.register(source, selectors.EVENT_READ)
        return bool(selector.select(timeout=max(seconds, 0.0)))
