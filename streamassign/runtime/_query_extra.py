"""Imported first by ``streamassign.runtime.query_server``: without aiohttp, importing it fails
with ``MissingExtraError`` naming the runtime extra, not with a bare ``ModuleNotFoundError``."""

from ..errors import require_extra
from ._extra import QUERIES

require_extra("streamassign.runtime.query_server", "runtime", QUERIES)
