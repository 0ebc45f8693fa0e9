"""Imported first by ``streamassign.runtime``: without the runtime extra, importing the package
(or any module of it) fails with ``MissingExtraError`` naming the extra, not with a bare
``ModuleNotFoundError`` from deep inside. Only aiokafka is needed to import it: rocksdict (for
RocksDB stores) and aiohttp (for the query server) are checked where they are first used."""

from ..errors import require_extra

require_extra("streamassign.runtime", "runtime", {"aiokafka": "aiokafka"})
