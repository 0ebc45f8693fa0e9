"""Imported first by ``streamassign.aiokafka``: without the aiokafka extra, importing the package
(or any module of it) fails with ``MissingExtraError`` naming the extra, not with a bare
``ModuleNotFoundError`` from deep inside; with an aiokafka below the extra's range, with
``ExtraVersionError`` naming the version installed."""

from ..errors import require_extra

#: The aiokafka extra's requirements, as pyproject.toml lists them (a test compares the two).
REQUIREMENTS = {"aiokafka": "aiokafka>=0.11,<0.15"}

require_extra("streamassign.aiokafka", "aiokafka", REQUIREMENTS)
