"""Imported first by ``streamassign.runtime.query_server``: without aiohttp, importing it fails
with ``MissingExtraError`` naming the runtime extra, not with a bare ``ModuleNotFoundError``."""

from ._extra import require_queries

require_queries("streamassign.runtime.query_server")
