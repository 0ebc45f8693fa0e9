"""What several parts of the Faust drop-in read of a Faust app the same way."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from faust.types.enums import ProcessingGuarantee

__all__ = ["aiokafka_consumer", "exactly_once", "faust_version"]


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
