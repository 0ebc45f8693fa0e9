"""What several parts of the Faust drop-in read of a Faust app the same way."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from faust.types.enums import ProcessingGuarantee

__all__ = ["aiokafka_consumer", "exactly_once", "faust_version", "recovery_interrupted"]


def aiokafka_consumer(app: Any) -> Any:
    """The aiokafka consumer of ``app``'s worker (on Faust's consumer thread); None before it
    started."""
    return getattr(getattr(app.consumer, "_thread", None), "_consumer", None)


def exactly_once(app: Any) -> bool:
    """Whether ``app`` runs under ``processing_guarantee="exactly_once"`` (transactions)."""
    guarantee = getattr(app.conf, "processing_guarantee", None)  # typed as the class
    return bool(guarantee == ProcessingGuarantee.EXACTLY_ONCE)


def faust_version() -> str:
    """The installed faust-streaming's version, for log lines that name it."""
    try:
        return importlib.metadata.version("faust-streaming")
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def recovery_interrupted(app: Any) -> bool:
    """Whether Faust's table recovery has been told to start over (a join's
    ``signal_recovery_start``, cleared when it does). Told while it waits for the actives, it
    raises out of that wait into an ``except Exception`` (faust-streaming 0.12-0.15), and with
    no standby partition to start its next step sends ``on_rebalance_complete`` for the
    unfinished restore; it notices at the wait after, before it sets ``completed``. Such an
    announcement completes nothing."""
    recovery = getattr(app.tables, "recovery", None)
    restart = getattr(recovery, "signal_recovery_start", None)
    return restart is not None and bool(restart.is_set())
