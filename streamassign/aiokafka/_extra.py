"""Imported first by ``streamassign.aiokafka``: without the aiokafka extra, importing the package
(or any module of it) fails with ``MissingExtraError`` naming the extra, not with a bare
``ModuleNotFoundError`` from deep inside."""

from ..errors import require_extra

require_extra("streamassign.aiokafka", "aiokafka", {"aiokafka": "aiokafka"})
