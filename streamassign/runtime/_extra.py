"""Imported first by ``streamassign.runtime``: without the runtime extra, importing the package
(or any module of it) fails with ``MissingExtraError`` naming the extra, not with a bare
``ModuleNotFoundError`` from deep inside; with an aiokafka below 0.14 (the request builders the
runtime uses came with it), with ``ExtraVersionError`` naming the version installed. Only
aiokafka is needed to import the package: rocksdict (for RocksDB stores) and aiohttp (for the
query server, ``QUERIES``) are checked where they are first used."""

from ..errors import require_extra

#: The runtime extra's requirements, as pyproject.toml lists them (a test compares the two).
REQUIREMENTS = {"aiokafka": "aiokafka>=0.14,<0.15"}
#: What ``query_server`` needs besides (aiohttp takes a while to import: not imported before).
QUERIES = {"aiohttp": "aiohttp>=3.9,<4"}
#: What ``store_kind="rocksdb"`` needs besides (0.3.24: the stores' ``WriteBufferManager``).
STORES = {"rocksdict": "rocksdict>=0.3.24,<0.4"}

require_extra("streamassign.runtime", "runtime", REQUIREMENTS)


def require_queries(feature: str) -> None:
    """Check ``QUERIES`` for ``feature``: by the query server's module as it is first imported,
    and by the package's lazy ``QueryServer``/``QueryClient`` before (naming what was read),
    which are then kept as the package's own: a check or two per process."""
    require_extra(feature, "runtime", QUERIES)
