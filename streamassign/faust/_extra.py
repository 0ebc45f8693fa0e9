"""Imported first by ``streamassign.faust``: without the faust extra, importing the package
(or any module of it) fails with ``MissingExtraError`` naming the extra, not with a bare
``ModuleNotFoundError`` from deep inside; with a faust-streaming or aiokafka below the extra's
range, with ``ExtraVersionError`` naming the version installed."""

from ..errors import require_extra

#: The faust extra's requirements, as pyproject.toml lists them (a test compares the two).
REQUIREMENTS = {"faust": "faust-streaming>=0.12,<0.16", "aiokafka": "aiokafka>=0.11,<0.15"}

require_extra("streamassign.faust", "faust", REQUIREMENTS)
