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

require_extra("streamassign.runtime", "runtime", REQUIREMENTS)

_queries_checked = False


def require_queries(feature: str) -> None:
    """Check ``QUERIES`` for ``feature`` once per process: the query server's module and the
    package's lazy attributes both ask, and each check reads pip's metadata (milliseconds)."""
    global _queries_checked
    if not _queries_checked:
        require_extra(feature, "runtime", QUERIES)
        _queries_checked = True
