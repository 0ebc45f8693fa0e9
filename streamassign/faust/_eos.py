"""The one WARNING a Faust app running ``processing_guarantee="exactly_once"`` with the drop-in
gets: what Faust's exactly_once does not keep, whichever assignor (docs/faust.md, "Exactly
once")."""

from __future__ import annotations

import logging
from typing import Any

from ._app import exactly_once, faust_version

__all__ = ["warn_if_exactly_once"]

log = logging.getLogger("streamassign.faust")


def warn_if_exactly_once(app: Any) -> None:
    """One WARNING under exactly_once: Faust commits a transaction's source offsets while
    table changelog writes of the same events may still wait in its producer's buffer (they
    join the next transaction, and are lost if that one aborts), and it sends to sink topics
    outside any transaction; neither depends on the assignor. At-least-once on
    ``streamassign://`` keeps tables exact. Said once per worker, where its logging is set
    up: at its consumer's start on ``streamassign://`` (whichever assignor), else where the
    assignor warns about Faust's own transport."""
    try:
        if not exactly_once(app):
            return
    except Exception:  # an app not configured yet (or a stand-in): nothing to say
        return
    log.warning(
        "processing_guarantee='exactly_once': Faust's exactly_once (faust-streaming %s) does "
        "not keep tables exact across aborted transactions nor write sink topics in "
        "transactions, whichever assignor; at_least_once with broker='streamassign://...' "
        'keeps tables exact (docs/faust.md, "Exactly once")',
        faust_version(),
    )
