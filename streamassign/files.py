"""Local files the library writes and reads: atomic, durable saves and guarded TOML loads.

``write_atomically`` is the one way the project replaces a file it owns (restart state,
checkpoints, process ids, assignor state): readers see the old content or the new, never a torn
mix, even with several threads saving the same file at once. ``load_toml`` reads a file a user
wrote and turns every way it can fail (unreadable, not UTF-8, invalid, nested too deep for the
parser, too large) into one typed error naming the file; ``loads_json`` does the same for JSON
bytes from outside (a saved state file, a group member's user data, a changelog record).
Pure standard library.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any, BinaryIO

from .errors import StreamAssignError

#: Larger TOML files are refused before parsing: a topology or clients file is a few KB, a
#: generated clients file for thousands of processes a few MB.
MAX_TOML_BYTES = 64 << 20
#: What ``read_bounded`` reads at a time.
_READ_CHUNK = 64 << 10


def write_atomically(
    path: str | os.PathLike[str], data: bytes, *, durable: bool = True, mode: int = 0o600
) -> None:
    """Replace ``path`` with ``data``: readers see the old file or the new, never a mix.

    The data goes to a temporary file with a unique name in the same directory (so concurrent
    writers never share one, and the rename stays on one file system), which is flushed to disk
    and renamed over ``path`` with ``os.replace``; then the directory is synced so the rename
    survives a crash. ``durable=False`` skips both syncs (atomic, not crash-durable). The file
    gets ``mode``: by default 0600 (``mkstemp``'s), state files being private to the process's
    user; results meant for others (a plan to share) pass e.g. 0o644. On
    failure the temporary file is removed and ``path`` is untouched; ``OSError`` propagates.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode != 0o600:
                os.fchmod(fh.fileno(), mode)
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        sync_directory(target.parent)


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """Flush ``directory``'s entries (renames, creations) to disk; a no-op where file systems
    cannot sync a directory."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary file ``write_atomically`` leaves behind when the process
    dies between creating and renaming it (never a complete save; safe to delete)."""
    return name.startswith(".") and name.endswith(".tmp")


def read_bounded(fh: BinaryIO, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``fh`` (more than ``limit`` says "too large"), allocating
    about what the file holds: ``fh.read(limit + 1)`` allocates all of ``limit`` up front, so
    each small file read that way would cost ``limit`` bytes of memory."""
    chunks = []
    left = limit + 1
    while left > 0 and (chunk := fh.read(min(left, _READ_CHUNK))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def load_toml(
    path: str | os.PathLike[str], error: type[StreamAssignError], what: str
) -> dict[str, Any]:
    """The TOML document at ``path``; ``error("<path>: cannot read <what>: ...")`` for a file
    that cannot be read, is larger than ``MAX_TOML_BYTES``, is not UTF-8, is invalid TOML or is
    nested too deep for the parser. A UTF-8 byte-order mark (Windows editors write one) is
    skipped: TOML has none, and tomllib would report an invalid statement at line 1."""
    return read_toml(path, error, what)[0]


def read_toml(
    path: str | os.PathLike[str], error: type[StreamAssignError], what: str
) -> tuple[dict[str, Any], str]:
    """``load_toml``'s document and the SHA-256 (hex) of the bytes it was parsed from: a second
    read to hash the file could see another version of it."""
    import hashlib

    source = Path(path)
    try:
        with source.open("rb") as fh:
            raw = read_bounded(fh, MAX_TOML_BYTES)
    except OSError as exc:
        raise error(f"{source}: cannot read {what}: {exc}") from exc
    if len(raw) > MAX_TOML_BYTES:
        raise error(f"{source}: {what} larger than {MAX_TOML_BYTES} bytes; refused")
    try:
        return tomllib.loads(raw.decode("utf-8-sig")), hashlib.sha256(raw).hexdigest()
    except UnicodeDecodeError as exc:
        raise error(f"{source}: {what} is not UTF-8 text (TOML is UTF-8): {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{source}: invalid TOML in {what}: {exc}") from exc
    except RecursionError as exc:
        raise error(f"{source}: {what} is nested too deep to parse") from exc


def loads_json(data: bytes | str, error: type[StreamAssignError], what: str) -> Any:
    """``data`` parsed as JSON, or ``error("<what> ...")`` when it is not JSON (or not UTF-8),
    is nested too deep for the parser, or holds a number that is not finite: ``NaN``,
    ``Infinity`` or one beyond a float's range (``1e999``). ``json.loads`` accepts those, and
    ``int()`` of them raises ``OverflowError`` or ``ValueError`` in the decoder that reads the
    number; refused here, a decoder of untrusted bytes meets finite numbers only."""

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise error(f"{what} holds {text}, a number beyond a float's range")
        return value

    def no_constant(name: str) -> Any:
        raise error(f"{what} holds {name}, not a finite number")

    try:
        return json.loads(data, parse_float=finite, parse_constant=no_constant)
    except error:
        raise
    except RecursionError as exc:
        raise error(f"{what} nested too deeply") from exc
    except ValueError as exc:  # not JSON, not UTF-8, an integer of too many digits
        raise error(f"{what} invalid: {exc}") from exc
