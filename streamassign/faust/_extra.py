"""Imported first by ``streamassign.faust``: without the faust extra, importing the package
(or any module of it) fails with ``MissingExtraError`` naming the extra, not with a bare
``ModuleNotFoundError`` from deep inside."""

from ..errors import require_extra

require_extra("streamassign.faust", "faust", {"faust": "faust-streaming", "aiokafka": "aiokafka"})
