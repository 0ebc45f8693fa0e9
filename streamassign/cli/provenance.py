"""Which code wrote a run: this code, or other code (another fingerprint of the package, another
version of streamassign or of a library whose code writes the run's rows). ``simulate`` records
it in the manifest; a rerun keeps a run only if this code wrote it, and a refusal names what
differs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import installed_version


def other_code(manifest: Mapping[str, Any]) -> str | None:
    """How the code that wrote the run of ``manifest`` is not this code, or None if it is:
    its rows may differ, settings alike. Compared: the package's ``code_fingerprint`` (never
    equal when this code has none), its version and the versions of the libraries whose
    code writes the run's rows (``row_libraries``: pyspark, the peers' assignors). A run
    written before manifests recorded these counts as other code; only what differs is
    named."""
    from ..pipeline.runs import CODE_FINGERPRINT, this_code

    code = this_code()
    if code.fingerprint is None:
        return (
            f"not known to be by this code (the streamassign package at {code.where} cannot "
            "be read to fingerprint it)"
        )
    recorded = manifest.get(CODE_FINGERPRINT)
    if not isinstance(recorded, str):  # older code, or code that could not read its files
        return "written by other code (no fingerprint recorded)"
    differences = []
    if recorded != code.fingerprint:
        differences.append(f"fingerprint {recorded[:12]}…, this code's {code.fingerprint[:12]}…")
    release, ours = manifest.get("streamassign"), dist_version("streamassign")
    if release != ours:
        differences.append(f"streamassign {release or 'unrecorded'}, this is {ours}")
    libraries = manifest.get("libraries")
    recorded_libraries = libraries if isinstance(libraries, dict) else {}
    for name, installed in row_libraries(manifest.get("assignors")).items():
        if recorded_libraries.get(name) != installed:
            differences.append(
                f"{name} {recorded_libraries.get(name, 'unrecorded')}, installed {installed}"
            )
    return f"written by other code ({'; '.join(differences)})" if differences else None


def row_libraries(assignors: object) -> dict[str, str]:
    """The installed versions of the libraries, besides streamassign, whose code writes the
    rows of a run of ``assignors``: pyspark, and the peers whose assignors it compares
    (faust-streaming, aiokafka). Recorded in the manifest as ``libraries``."""
    from ..pipeline.assignors import peer_distributions

    names = assignors if isinstance(assignors, list | tuple) else []
    return {dist: dist_version(dist) for dist in ("pyspark", *peer_distributions(names))}


def dist_version(dist: str) -> str:
    """The installed version of the distribution ``dist``, as a manifest records it."""
    return installed_version(dist) or "not installed"
