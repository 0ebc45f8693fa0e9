"""Telling a retried condition's news from its repeats (``Repeats``), so that what every retry
(1 to 30 s apart) finds again is logged once per distinct state and once when it ends, not at
every retry: the Faust assignor's waits for missing topics (leader and members) and the streams
leader's topology errors (``streamassign.streams.assign_streams``, kept by ``ProcessHost``).

In the core so that every layer that retries can import it."""

from __future__ import annotations

import logging
from collections.abc import Hashable

import attrs

__all__ = ["Repeats", "log_error_once"]


@attrs.define
class Repeats:
    """Whether a condition met at every retry is news: a state not reported yet, or the end of
    the condition. One per condition and per owner (a leader's, a member's): it remembers only
    the state reported last."""

    #: The state reported last; None while the condition does not hold.
    reported: Hashable | None = None

    def changed(self, state: Hashable) -> bool:
        """Whether ``state`` differs from the one reported last (it is reported now)."""
        news = state != self.reported
        self.reported = state
        return news

    def ended(self) -> bool:
        """Whether the condition held until now (it does not any more)."""
        held = self.reported is not None
        self.reported = None
        return held


def log_error_once(
    logger: logging.Logger, logged: Repeats | None, error: Exception, message: str
) -> None:
    """Log ``message % error`` at ERROR when ``error`` is news to ``logged`` (always without
    one), at DEBUG when it is the error ``logged`` reported last."""
    news = logged is None or logged.changed(str(error))
    suffix = "" if logged is None else " (the same error again logged at DEBUG)"
    logger.log(logging.ERROR if news else logging.DEBUG, message + suffix, error)
