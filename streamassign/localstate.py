"""A process's state directory: its persistent process id and the checkpoints of its tasks.

Kafka Streams keeps the process id in the state directory, so a restarted process is the same
client to the leader, and reports, for every task whose state it has on disk, the sum of the
checkpointed changelog offsets; that is what makes restarts sticky. Same here:

    <state_dir>/process.id                  the process id (a UUID), created once
    <state_dir>/tasks/<s_p>/checkpoint      JSON {"<changelog topic>": {"<partition>": offset}}
    <state_dir>/assignment.json             JSON {"<consumer index>": ["<s_p>", ...]}: the
                                            active tasks each consumer ran last, reported
                                            after a restart so the process gets them back

    <state_dir>/tasks/<s_p>.removed-<hex>   a task's state being deleted (``retire_task``)

A lock file keeps two processes from sharing one directory (they would report each other's
state). Every file is replaced atomically (``files.write_atomically``: unique temporary name,
fsync, rename, directory fsync), so readers never see a torn file, whichever thread saves.

Damaged state never keeps the process out of its group: a file or directory that holds
something implausible (not UTF-8, not JSON, nested too deep, offsets that are not integers in
``[0, 2**63)`` or sum past it, a task id out of range) or has something else in its place (a file
where a task directory belongs, a directory where a file belongs, a loop of links) counts as "no
state" for its task. It is logged once and renamed to a ``<name>.damaged-<UTC time>`` sibling for
inspection, never deleted. State that cannot be read *now* (no permission, too many open files,
an I/O error: ``is_damage`` tells the two apart) is not damaged: it is kept where it is, counts
as not there for that one read, and is logged once per cause; a ``process.id`` that cannot be
read stops the open (``StateDirectoryError``) rather than give the process a new identity.
Standard library only (and the core's ``Repeats``); the runtime writes checkpoints, the
protocol reads the sums. The process passes what its topology's tasks hold (each subtopology's
changelogs): state another topology version left (a store removed, a subtopology removed or
renumbered by an upgrade) is then neither summed nor claimed, and is not touched here.

The state of a task the process no longer holds is deleted in two steps (Kafka Streams'
``state.cleanup.delay.ms``; the owner of the stores decides which tasks and when):
``retire_task`` renames its directory at once, so from then on it is nobody's state (not
reported, and an open of the task starts a new directory), and ``delete_retired`` deletes
what was retired, which can take seconds for a large RocksDB store (call it off the event
loop).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, Any

from ._ids import TaskId, TopicPartition
from .errors import DamagedStateError, StateDirectoryError
from .errors import StateDirectoryLockedError as StateDirectoryLockedError  # old home
from .files import is_temporary, read_bounded, sync_directory, write_atomically
from .repeats import Repeats

log = logging.getLogger("streamassign.localstate")

#: A checkpoint or assignment file larger than this is damaged, not state: a checkpoint holds
#: one entry per changelog partition of a task, the assignment one task id per active task.
MAX_STATE_FILE_BYTES = 16 << 20
#: Task ids and partitions are Kafka int32s; larger ones on disk did not come from this library.
_ID_LIMIT = 1 << 31
#: Offset sums travel as int64s, and negative ones are sentinels (``LATEST_OFFSET`` = running).
_OFFSET_LIMIT = 1 << 63
#: Marks a retired task directory, to be deleted (``<s_p>.removed-<hex>``).
_REMOVED = ".removed-"
#: Marks damaged state set aside for inspection (``<name>.damaged-<UTC time>``).
DAMAGED_SUFFIX = ".damaged-"
#: Bytes ``probe_writes`` writes. No test write proves the next RocksDB write will succeed
#: (another writer can fill the disk a moment later, and a store's open also flushes its log's
#: unflushed records, up to its memtables' size). What it can prove is what the first open of
#: a stored task needs before any record: measured, reopening a store wrote ~30 KB (its info
#: log ~20 KB, an OPTIONS file 7.5 KB, a new MANIFEST, the CURRENT file). Twice that, so a disk
#: with a few blocks left fails here rather than at that open; free space compared to a
#: threshold would not do: it misses quotas, inodes, a read-only mount, permissions and
#: the root reserve, which a write made with the process's own rights meets as RocksDB does.
PROBE_BYTES = 64 << 10
#: How ``probe_writes``'s file is named (then random letters and ``.tmp``).
_PROBE = ".write-probe."
#: Causes in a RocksDB status that are never the files' fault, even inside a corruption
#: status: another process (or this one) holds the store, or the disk or its permissions are
#: the operator's to fix. Setting the store aside would not help (a full disk) or would take a
#: live store's files. Matched as substrings.
NOT_DAMAGE_STATUSES = (
    "While lock file",  # not "LOCK" alone: statuses name files, and paths may hold it
    "lock hold",
    "No locks available",
    "Resource temporarily unavailable",
    "No space left",
    "Disk quota exceeded",
    "Permission denied",
    "Operation not permitted",
    "Read-only file system",
    "Input/output error",
    "Too many open files",
    "Cannot allocate memory",
)


def rename_aside(path: Path) -> Path:
    """Rename ``path`` to a ``<name>.damaged-<UTC time>`` sibling (same directory, so never
    across devices), never over an earlier one; the new path. Raises ``OSError`` if it
    cannot be renamed."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}")
    n = 1
    while aside.exists() or aside.is_symlink():  # os.rename would replace an earlier one
        n += 1
        aside = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}-{n}")
    path.rename(aside)
    return aside


#: Errnos of a failed read that say something else is in the path's place: a file where a
#: directory belongs (ENOTDIR), a directory where a file belongs (EISDIR), a loop of links
#: (ELOOP). Every other errno (EACCES, EPERM, EMFILE, ENFILE, EIO, ENOSPC, ENOMEM...) is the
#: environment's, not the state's: renaming would not mend it, and would move live state.
_SOMETHING_ELSE_IN_PLACE = frozenset({errno.ENOTDIR, errno.EISDIR, errno.ELOOP})


def is_damage(exc: BaseException) -> bool:
    """Whether ``exc``, raised reading local state, says that state is damaged (set it aside:
    it counts as none) rather than absent (ENOENT) or unreadable now (no permission, too many
    open files, an I/O error: keep it, the operator's to fix or passing). Content that cannot
    be decoded or parsed (``ValueError``, ``DamagedStateError`` included) is damage."""
    if isinstance(exc, OSError):
        return exc.errno in _SOMETHING_ELSE_IN_PLACE
    return isinstance(exc, (ValueError, RecursionError))


class StateDirectory:
    """The state directory of one process; ``close()`` releases its lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        #: Damaged paths that could not be moved aside: logged once, then skipped quietly.
        self._stuck: set[Path] = set()
        #: Task state that could not be removed or deleted: logged once, then tried quietly.
        self._undeletable: set[Path] = set()
        #: Whether the last ``delete_retired`` left a retired directory it could not delete.
        self.retired_left = False
        #: The cause of the state each reader ("offset sums", "assignment", "checkpoint of
        #: task 0_1") last could not read: the same cause again is logged at DEBUG only.
        self._unreadable: defaultdict[str, Repeats] = defaultdict(Repeats)
        #: Tasks whose checkpoint had entries left out of the last offset sums read
        #: (``_log_left_out``).
        self._left_out_logged: frozenset[TaskId] = frozenset()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock: IO[bytes] | None = self._lock_file()
        except OSError as exc:
            raise _unusable(self.path, exc) from exc
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self.close()
            raise StateDirectoryLockedError(
                f"state directory {self.path} is in use by another process"
            ) from exc
        except OSError as exc:  # no locks on this filesystem (ENOLCK on some NFS mounts)
            self.close()
            raise _unusable(self.path, exc) from exc
        try:
            self._remove_temporaries()
            self._directory(self.path / "tasks")
            self.process_id = self._process_id()
        except BaseException as exc:  # a half-opened directory keeps no lock
            self.close()
            if isinstance(exc, OSError) and not isinstance(exc, StateDirectoryError):
                raise _unusable(self.path, exc) from exc
            raise

    def _lock_file(self) -> IO[bytes]:
        """The lock file, opened; a directory or a looping link in its place is set aside."""
        file = self.path / ".lock"
        special = _special_file(file)
        if special is not None:
            self._set_aside(file, f"{special} where the file belongs")
        try:
            return file.open("wb")
        except OSError as exc:
            if not is_damage(exc):
                raise  # no permission, an I/O error: not damaged state, the operator's to fix
            self._set_aside(file, exc)
        return file.open("wb")

    # -- damaged state ---------------------------------------------------------------------------

    def _set_aside(self, path: Path, reason: object) -> None:
        """Rename damaged ``path`` to a ``.damaged-<time>`` sibling (kept for inspection, never
        deleted), logging once; if even that fails, remember it and stay quiet about it."""
        if path in self._stuck:
            return
        try:
            aside = self.set_aside(path)
        except OSError as exc:
            self._stuck.add(path)
            log.warning(
                "damaged local state %s (%s) counts as no state; cannot move it aside: %s",
                path,
                reason,
                exc,
            )
            return
        log.warning(
            "damaged local state %s (%s) counts as no state; moved to %s", path, reason, aside.name
        )

    def set_aside(self, path: Path) -> Path:
        """Rename damaged ``path`` (a file or a directory, e.g. a task's RocksDB store) aside
        (``rename_aside``), kept for inspection and never deleted (also not with its task's
        state: ``delete_retired``); returns the new path. Raises ``OSError`` if it cannot be
        renamed. The caller logs why."""
        return rename_aside(path)

    def _directory(self, path: Path) -> Path:
        """``path`` as a directory, creating it; anything else in its place (a file, a link
        to nothing or a loop of links) is set aside."""
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            self._set_aside(path, not_a_directory(path))
            path.mkdir(parents=True, exist_ok=True)
        return path

    def task_directory(self, task: TaskId) -> Path:
        """``task``'s directory, created (before its stores open in it); anything else in its
        place is set aside, so the stores open empty and restore from their changelogs."""
        return self._directory(self.task_dir(task))

    def _unreadable_now(self, reader: str, failures: Mapping[Path, OSError], outcome: str) -> None:
        """Log what ``reader`` could not read now (``failures``, not damage: nothing is moved)
        at ERROR once per cause, the same cause again at DEBUG; and, once it reads everything
        again (no ``failures``), one INFO line."""
        logged = self._unreadable[reader]
        if not failures:
            if logged.ended():
                log.info("local state in %s can be read again (%s)", self.path, reader)
            return
        causes = tuple(sorted({exc.strerror or repr(exc) for exc in failures.values()}))
        first = min(failures)
        log.log(
            logging.ERROR if logged.changed(causes) else logging.DEBUG,
            "cannot read local state %s%s (%s): %s; left in place (not damaged: nothing is set "
            "aside) and read again next time (the same cause again logs at DEBUG only)",
            first,
            f" and {len(failures) - 1} more" if len(failures) > 1 else "",
            "; ".join(causes),
            outcome,
        )

    def _read_json(self, file: Path) -> Any:
        """``file``'s JSON content; ``DamagedStateError`` when it is damaged (``is_damage``:
        something else in its place, not parseable, NaN/Infinity and over-large numbers
        included); any other ``OSError`` as raised (``FileNotFoundError`` when absent)."""
        special = _special_file(file)
        if special is not None:
            raise DamagedStateError(f"{special} where a file belongs")
        try:
            with file.open("rb") as fh:
                raw = read_bounded(fh, MAX_STATE_FILE_BYTES)
        except OSError as exc:
            if not is_damage(exc):
                raise  # absent, or cannot be read now: nothing to set aside
            raise DamagedStateError(f"unreadable: {exc}") from exc
        if len(raw) > MAX_STATE_FILE_BYTES:
            raise DamagedStateError(f"larger than {MAX_STATE_FILE_BYTES} bytes")
        try:
            return json.loads(raw, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise DamagedStateError(f"not valid JSON: {exc!r}") from exc

    def _remove_temporaries(self) -> None:
        """Delete temporary files of saves interrupted by a crash (never a complete save), and
        a test write's (``probe_writes``)."""
        entries = list(self.path.iterdir())
        with contextlib.suppress(OSError):  # no tasks/ yet, or not a directory (mended later)
            entries += [e for e in (self.path / "tasks").iterdir() if e.name.startswith(_PROBE)]
        for entry in entries:
            if is_temporary(entry.name) and entry.is_file():
                with contextlib.suppress(OSError):  # only litter: never worth failing over
                    entry.unlink()

    def probe_writes(self, size: int = PROBE_BYTES) -> None:
        """Write ``size`` bytes to a new file in ``tasks/`` (where the stores are), fsync it and
        remove it: ``StateDirectoryError``, one line, if the disk refuses (full, a quota, no
        inodes, read-only, no permission, an I/O error). For a process about to claim its
        stored tasks: joining, it would get them back and fail to open them at once, and each
        restart by a supervisor would cost its whole group two rebalances. The file is a
        temporary one (``files.is_temporary``): left by a crash, the next open removes it."""
        directory = self.path / "tasks"
        try:
            fd, name = tempfile.mkstemp(dir=directory, prefix=_PROBE, suffix=".tmp")
        except OSError as exc:
            raise self._refused_writes(directory, size, exc) from exc
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(size))  # zeros a compressing filesystem would not store
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise self._refused_writes(directory, size, exc) from exc
        finally:
            with contextlib.suppress(OSError):  # a full disk still lets a file be removed
                os.unlink(name)

    def _refused_writes(self, directory: Path, size: int, exc: OSError) -> StateDirectoryError:
        return StateDirectoryError(
            f"state directory {self.path} cannot be used: a test write of {size >> 10} KiB to "
            f"{directory} failed: {exc.strerror or exc}; its stores could be neither opened "
            "nor written (free space or fix the directory, then start the process again)"
        )

    # -- process id ------------------------------------------------------------------------------

    def _process_id(self) -> uuid.UUID:
        """The process id; a new one when there is none or it is damaged (set aside). One that
        cannot be read now (no permission, an I/O error) raises ``StateDirectoryError``: a new
        id would make a stranger of this process to its group (its tasks move and restore), and
        retrying here would only hold up a start the operator has to fix anyway."""
        file = self.path / "process.id"
        try:
            special = _special_file(file)
            if special is not None:
                raise DamagedStateError(f"{special} where the file belongs")
            return uuid.UUID(file.read_text().strip())
        except FileNotFoundError:
            pass
        except ValueError as exc:  # not UTF-8, not a UUID
            self._set_aside(file, exc)
        except OSError as exc:
            if not is_damage(exc):
                raise StateDirectoryError(
                    f"state directory {self.path} cannot be used: cannot read its process id "
                    f"({file}: {exc.strerror or exc}); not replaced, so the process keeps its "
                    "identity and tasks once this is fixed (its permission, the disk); or "
                    "delete it to start with a new id (its tasks then restore elsewhere or "
                    "warm up here again)"
                ) from exc
            self._set_aside(file, exc)  # a directory or a loop of links in its place
        pid = uuid.uuid4()
        write_atomically(file, str(pid).encode())
        return pid

    # -- checkpoints -----------------------------------------------------------------------------

    def task_dir(self, task: TaskId) -> Path:
        return self.path / "tasks" / str(task)

    def write_checkpoint(
        self, task: TaskId, offsets: Mapping[TopicPartition, int], *, durable: bool = True
    ) -> None:
        """Record the changelog offsets ``task``'s local state has reached (atomically;
        ``durable=False`` skips the fsyncs, for frequent checkpoints a crash may lose)."""
        data: dict[str, dict[str, int]] = {}
        for tp, offset in offsets.items():
            data.setdefault(tp.topic, {})[str(tp.partition)] = offset
        file = self._directory(self.task_dir(task)) / "checkpoint"
        if file.is_dir():
            self._set_aside(file, "a directory where the checkpoint belongs")
        write_atomically(file, json.dumps(data, sort_keys=True).encode(), durable=durable)

    def read_checkpoint(self, task: TaskId) -> dict[TopicPartition, int]:
        """The checkpointed offsets of ``task``: empty when none, when damaged (set aside), or
        when it cannot be read now (kept; logged once per cause)."""
        reader = f"checkpoint of task {task}"  # one per task: another's read ends nothing
        try:
            offsets = self.read_checkpoint_or_raise(task)
        except OSError as exc:
            self._unreadable_now(
                reader,
                {self.task_dir(task) / "checkpoint": exc},
                f"task {task} counts as without a checkpoint this time",
            )
            return {}
        if reader in self._unreadable:  # (only tasks that failed are remembered)
            self._unreadable_now(reader, {}, "")
            del self._unreadable[reader]
        return offsets

    def read_checkpoint_or_raise(self, task: TaskId) -> dict[TopicPartition, int]:
        """``read_checkpoint``, but ``OSError`` when the checkpoint cannot be read now."""
        directory = self.task_dir(task)
        file = directory / "checkpoint"
        try:
            return _checkpoint_offsets(self._read_json(file))
        except FileNotFoundError:
            return {}
        except DamagedStateError as exc:
            # Something else where the task's directory belongs (a file, a loop of links:
            # ENOTDIR, ELOOP) is set aside, not the checkpoint path inside it (no rename
            # through it can work).
            if isinstance(exc.__cause__, OSError) and not directory.is_dir():
                self._set_aside(directory, not_a_directory(directory))
            else:
                self._set_aside(file, exc)
            return {}

    def delete_checkpoint(self, task: TaskId) -> None:
        """Forget ``task``'s checkpoint (its local state is gone, e.g. an in-memory store)."""
        file = self.task_dir(task) / "checkpoint"
        try:
            file.unlink(missing_ok=True)
        except NotADirectoryError:
            self._set_aside(self.task_dir(task), "not a directory")
        except IsADirectoryError:
            self._set_aside(file, "a directory where the checkpoint belongs")

    def delete_checkpoints(self) -> None:
        """Delete every task's checkpoint without reading it (in-memory stores: those of a
        previous run describe state that is gone; one that cannot be read now must go too, or
        it would be reported, once readable, as state the process does not have).
        ``StateDirectoryError`` naming the path if ``tasks/`` cannot be listed or a checkpoint
        cannot be deleted (no permission, an I/O error): left, it would be claimed later."""
        try:
            entries = list((self.path / "tasks").iterdir())
        except FileNotFoundError:
            return
        except OSError as exc:
            if is_damage(exc):  # holds no checkpoint that could be read: offset_sums mends it
                return
            raise self._cannot_delete_checkpoints(exc) from exc
        for entry in entries:
            task = _task_of(entry.name)
            if task is None or not _valid_task(task):
                continue  # no task's (never read as a checkpoint either)
            try:
                self.delete_checkpoint(task)
            except OSError as exc:
                if not is_damage(exc):  # damage (a loop) holds nothing readable
                    raise self._cannot_delete_checkpoints(exc) from exc

    def _cannot_delete_checkpoints(self, exc: OSError) -> StateDirectoryError:
        return StateDirectoryError(
            f"state directory {self.path} cannot be used: cannot delete the checkpoints of a "
            f"previous run ({exc.filename}: {exc.strerror or exc}); with in-memory stores they "
            "describe state that is gone, and would be reported as held once readable"
        )

    def offset_sums(
        self, changelogs: Mapping[int, Collection[str]] | None = None
    ) -> dict[TaskId, int]:
        """Sum of checkpointed changelog offsets of every task with local state. What cannot
        be read now (``tasks/`` or a checkpoint: too many open files, no permission, an I/O
        error) is left out of this report only, and kept as it is (logged once per cause).

        ``changelogs`` (each subtopology id of the process's topology -> the changelog topics
        its tasks checkpoint) makes these the sums of that topology's state: a task counts only
        its subtopology's changelogs at its own partition, one whose checkpoint holds none of
        them has no sum (no state), and a task of another subtopology reports nothing. The
        other entries are another topology version's (a store removed, a subtopology
        renumbered or removed by an upgrade: counted, they made the process claim warm state
        it did not have) or named otherwise than ``changelogs`` says. They are logged with
        what was found and expected (``_log_left_out``) and not touched here. Without
        ``changelogs`` every entry counts (the raw view: which changelogs the directory holds
        data of)."""
        unreadable: dict[Path, OSError] = {}
        sums: dict[TaskId, int] = {}
        #: Tasks with entries left out -> the topics of those (None: not this topology's task).
        left_out: dict[TaskId, frozenset[str] | None] = {}
        for entry in self._task_entries(unreadable):
            task = _task_of(entry.name)
            if task is None:
                continue  # not a task directory (set-aside state, files of other tools)
            if not _valid_task(task):
                self._set_aside(entry, f"task id {task} out of range")
                continue
            if changelogs is not None and task.subtopology not in changelogs:
                left_out[task] = None
                continue
            try:
                offsets = self.read_checkpoint_or_raise(task)
            except OSError as exc:
                unreadable[entry / "checkpoint"] = exc
                continue
            if changelogs is not None:
                own = _own_offsets(offsets, task, changelogs[task.subtopology])
                if len(own) < len(offsets):
                    left_out[task] = frozenset(tp.topic for tp in offsets.keys() - own.keys())
                offsets = own
            if offsets:
                sums[task] = sum(offsets.values())
        self._unreadable_now("offset sums", unreadable, "not in the offset sums reported now")
        if changelogs is not None:
            self._log_left_out(left_out, changelogs)
        return sums

    def _log_left_out(
        self,
        left_out: Mapping[TaskId, frozenset[str] | None],
        changelogs: Mapping[int, Collection[str]],
    ) -> None:
        """One line when tasks with checkpoint entries left out of the sums appear (the sums
        are read at every join: the same tasks again are not news), naming per subtopology
        the topics found and those expected. WARNING when a topic found is not named like a
        changelog (``-changelog``): no topology version's, so likely a host that checkpoints
        under names of its own and loses its stickiness until it declares them."""
        news = left_out.keys() - self._left_out_logged
        self._left_out_logged = frozenset(left_out)
        if not news:
            return
        found: dict[int, set[str]] = defaultdict(set)
        for task, topics in left_out.items():
            found[task.subtopology].update(topics or ())
        parts = [
            _left_out_part(sub, [t for t in left_out if t.subtopology == sub], found, changelogs)
            for sub in sorted(found)
        ]
        odd = any(not t.endswith("-changelog") for s in changelogs for t in found.get(s, ()))
        log.log(
            logging.WARNING if odd else logging.INFO,
            "local state in %s left out of the offset sums (not the changelogs this topology's "
            "tasks checkpoint): %s. Either another topology version's (a store removed, a "
            "subtopology renumbered or removed: left on disk, see docs/streams.md) or, for a "
            "host that checkpoints its own stores, named otherwise: declare those names with "
            "ProcessHost(changelog_topics=...)",
            self.path,
            "; ".join(parts),
        )

    def read_checkpoints(
        self,
    ) -> tuple[dict[TaskId, dict[TopicPartition, int]], dict[Path, OSError]]:
        """Every task's checkpointed offsets, and what could not be read now (``tasks/`` or a
        checkpoint: kept, and not logged here: for a caller that must not guess, e.g. whether
        the local state holds data of a deleted changelog). Damage is set aside, as always."""
        unreadable: dict[Path, OSError] = {}
        found: dict[TaskId, dict[TopicPartition, int]] = {}
        for entry in self._task_entries(unreadable):
            task = _task_of(entry.name)
            if task is None or not _valid_task(task):
                continue  # not a task's (``offset_sums`` sets an out-of-range one aside)
            try:
                offsets = self.read_checkpoint_or_raise(task)
            except OSError as exc:
                unreadable[entry / "checkpoint"] = exc
                continue
            if offsets:
                found[task] = offsets
        return found, unreadable

    def _task_entries(self, unreadable: dict[Path, OSError]) -> list[Path]:
        """The entries of ``tasks/``, sorted; none if it cannot be listed. Removed, or
        replaced by a file or a loop of links (damage, set aside), it holds no store and is
        made again; if it cannot be listed now (``unreadable``) it is never moved: the stores
        in it may be open, and would go on writing into the moved directory."""
        root = self.path / "tasks"
        try:
            return sorted(root.iterdir())
        except FileNotFoundError:
            pass
        except OSError as exc:
            if not is_damage(exc):
                unreadable[root] = exc
                return []
            self._set_aside(root, exc)
        with contextlib.suppress(OSError):
            self._directory(root)
        return []

    # -- deleting the state of tasks no longer held ----------------------------------------------

    def local_tasks(self) -> set[TaskId]:
        """Tasks with a directory under ``tasks/``, with or without a checkpoint (state whose
        checkpoint was never written takes disk space too)."""
        try:
            entries = list((self.path / "tasks").iterdir())
        except OSError:  # gone or replaced under a running process: ``offset_sums`` mends it
            return set()
        tasks = set()
        for entry in entries:
            task = _task_of(entry.name)
            # Out of range ids are damaged state (kept for inspection), not a task's.
            if task is not None and _valid_task(task) and entry.is_dir():
                tasks.add(task)
        return tasks

    def retire_task(self, task: TaskId) -> Path | None:
        """Rename ``task``'s directory to ``<s_p>.removed-<hex>`` (one rename: quick, so the
        caller can check the task is unused and rename it in one step) for ``delete_retired``.
        Only for a task whose stores are closed: an open store would go on writing into the
        renamed directory. Returns the new path; None when there is no directory, or when it
        cannot be renamed (logged once)."""
        directory = self.task_dir(task)
        aside = directory.with_name(f"{directory.name}{_REMOVED}{uuid.uuid4().hex[:12]}")
        try:
            directory.rename(aside)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._cannot_delete(directory, f"cannot remove the local state of task {task}", exc)
            return None
        self._undeletable.discard(directory)
        return aside

    def delete_retired(self) -> int:
        """Delete every directory ``retire_task`` renamed (those left by a crash mid-delete
        too); returns how many. Blocking, and slow for large stores: call it in a thread, one
        call at a time. One that cannot be deleted is logged (once) and left for the next call
        (``retired_left`` says whether there is one)."""
        self.retired_left = False
        try:
            entries = [e for e in (self.path / "tasks").iterdir() if _is_removed(e.name)]
        except OSError:
            return 0
        if not entries:
            return 0
        try:
            # The renames reach the disk before any unlink: after a power loss mid-delete a
            # task's directory is retired or whole, never half deleted under its own name.
            sync_directory(self.path / "tasks")
        except OSError as exc:
            self.retired_left = True
            self._cannot_delete(self.path / "tasks", "cannot sync the retired task state", exc)
            return 0
        deleted = 0
        for entry in entries:
            try:
                # A link is removed, not followed: what it points to was never ours to delete.
                if entry.is_symlink() or not entry.is_dir():
                    entry.unlink()
                else:
                    _keep_damaged(entry)
                    shutil.rmtree(entry)
            except FileNotFoundError:
                continue
            except OSError as exc:
                self._cannot_delete(entry, "cannot delete the state of a task no longer held", exc)
                self.retired_left = True
                continue
            self._undeletable.discard(entry)
            deleted += 1
        return deleted

    def _cannot_delete(self, path: Path, what: str, exc: OSError) -> None:
        """Log a failed removal or delete once per path (each later call tries it again)."""
        if path not in self._undeletable:
            self._undeletable.add(path)
            log.warning("%s (%s): %s; trying again at each cleanup", what, path, exc)

    # -- last assignment -------------------------------------------------------------------------

    def write_assignment(self, actives: Mapping[int, frozenset[TaskId]]) -> None:
        """Remember each consumer's active tasks (atomically and durably)."""
        data = {str(i): sorted(str(t) for t in tasks) for i, tasks in actives.items()}
        file = self.path / "assignment.json"
        if file.is_dir():
            self._set_aside(file, "a directory where the file belongs")
        write_atomically(file, json.dumps(data, sort_keys=True).encode())

    def read_assignment(
        self, subtopologies: Collection[int] | None = None
    ) -> dict[int, frozenset[TaskId]]:
        """The active tasks each consumer ran before the process stopped: empty if unknown, if
        the file is damaged (set aside), or if it cannot be read now (kept; logged).

        ``subtopologies`` (those of the process's topology) leaves out, with one INFO line, the
        tasks of any other: another topology version ran them (an upgrade removed or renumbered
        their subtopology), and claimed, they would make the leader count this process as their
        previous owner. The file is not rewritten here: a rollback to that version before the
        process saves an assignment of its own reads it as it was."""
        saved = self._saved_assignment()
        if subtopologies is None:
            return saved
        current = {
            i: frozenset(t for t in ts if t.subtopology in subtopologies) for i, ts in saved.items()
        }
        dropped = {t for i, ts in saved.items() for t in ts - current[i]}
        if dropped:
            log.info(
                "saved active tasks %s in %s are not tasks of this topology (another topology "
                "version's: a subtopology removed or renumbered): not claimed back",
                _task_list(dropped),
                self.path,
            )
        return current

    def _saved_assignment(self) -> dict[int, frozenset[TaskId]]:
        """``read_assignment`` of every task saved."""
        file = self.path / "assignment.json"
        try:
            return _assignment(self._read_json(file))
        except FileNotFoundError:
            return {}
        except DamagedStateError as exc:
            self._set_aside(file, exc)
            return {}
        except OSError as exc:
            outcome = "the tasks each consumer ran before are not claimed this time"
            self._unreadable_now("assignment", {file: exc}, outcome)
            return {}

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _unusable(path: Path, exc: OSError) -> StateDirectoryError:
    """The one-line error for a state directory the process cannot use."""
    reason = "it exists and is not a directory" if isinstance(exc, FileExistsError) else None
    return StateDirectoryError(
        f"state directory {path} cannot be used: {reason or exc.strerror or exc}"
        + (f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else "")
    )


def _special_file(path: Path) -> str | None:
    """What ``path`` is if it is neither a regular file nor a directory (a FIFO, a socket, a
    device: opening a FIFO blocks until a writer comes, the event loop with it): damage where a
    file belongs. None otherwise, also when it cannot be told (the open says why)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket or device"


def not_a_directory(path: Path) -> str:
    """Why ``path``, where a directory belongs, is none: for logs (a link says where it leads,
    e.g. to a disk that is not mounted)."""
    try:
        return f"a link to {os.readlink(path)}, which leads to no directory"
    except OSError:  # not a link
        return "not a directory"


def _is_removed(name: str) -> bool:
    """Whether a ``tasks/`` entry is a task directory ``retire_task`` renamed (not damaged
    state set aside for inspection: ``<name>.damaged-...`` is never deleted)."""
    task, marker, token = name.partition(_REMOVED)
    return bool(marker) and _task_of(task) is not None and token.isalnum() and token.isascii()


def _keep_damaged(removed: Path) -> None:
    """Move damaged state set aside inside a removed task directory (a ``checkpoint.damaged-...``)
    out of it, to ``tasks/<s_p>.<name>``: damaged state is kept for inspection, always."""
    task = removed.name.partition(_REMOVED)[0]
    for inner in removed.iterdir():
        if DAMAGED_SUFFIX in inner.name:
            kept = removed.with_name(f"{task}.{inner.name}")
            if kept.exists() or kept.is_symlink():  # os.rename would replace it
                kept = kept.with_name(f"{kept.name}-{uuid.uuid4().hex[:6]}")
            inner.rename(kept)


def _no_constant(name: str) -> Any:
    raise DamagedStateError(f"{name} is not an offset")


def _task_of(name: str) -> TaskId | None:
    """The task a ``tasks/`` entry is named after, ``None`` unless named exactly ``"s_p"``."""
    try:
        task = TaskId.parse(name)
    except ValueError:
        return None
    return task if str(task) == name else None


def _valid_task(task: TaskId) -> bool:
    return task.subtopology < _ID_LIMIT and task.partition < _ID_LIMIT


def _is_index(text: str) -> bool:
    """Whether ``text`` is an int32 >= 0 in plain ASCII digits (a partition, a consumer)."""
    return text.isascii() and text.isdecimal() and len(text) <= 10 and int(text) < _ID_LIMIT


def _is_int(value: object, limit: int) -> bool:
    return type(value) is int and 0 <= value < limit


def _checkpoint_offsets(data: Any) -> dict[TopicPartition, int]:
    """Offsets of a checkpoint document; ``DamagedStateError`` for anything implausible."""
    if not isinstance(data, dict):
        raise DamagedStateError(f"expected an object of topics, got {type(data).__name__}")
    offsets: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        if not topic or not isinstance(parts, dict):
            raise DamagedStateError(f"topic {topic!r}: expected an object of partitions")
        for part, offset in parts.items():
            if not _is_index(part):
                raise DamagedStateError(f"{topic}: partition {part!r} is not an int32 >= 0")
            if not _is_int(offset, _OFFSET_LIMIT):
                raise DamagedStateError(f"{topic}-{part}: offset {offset!r} not in [0, 2**63)")
            offsets[TopicPartition(topic, int(part))] = offset
    if sum(offsets.values()) >= _OFFSET_LIMIT:
        raise DamagedStateError("offsets sum past 2**63 - 1 (an int64)")
    return offsets


def _task_list(tasks: Collection[TaskId], shown: int = 20) -> str:
    """``0_0, 0_1, 1_3``, the first ``shown`` in order and how many more (for a log line)."""
    ordered = sorted(tasks)
    more = f" and {len(ordered) - shown} more" if len(ordered) > shown else ""
    return ", ".join(str(t) for t in ordered[:shown]) + more


def _left_out_part(
    subtopology: int,
    tasks: Collection[TaskId],
    found: Mapping[int, Collection[str]],
    changelogs: Mapping[int, Collection[str]],
) -> str:
    """``subtopology 0 (tasks 0_0, 0_2): found a-log, expected a-changelog`` (a log line's)."""
    head = f"subtopology {subtopology} (tasks {_task_list(tasks)}): "
    if subtopology not in changelogs:
        return head + "not in this topology"
    expected = ", ".join(sorted(changelogs[subtopology])) or "none (it declares no stores)"
    return head + f"found {', '.join(sorted(found[subtopology]))}, expected {expected}"


def _own_offsets(
    offsets: Mapping[TopicPartition, int], task: TaskId, changelogs: Collection[str]
) -> dict[TopicPartition, int]:
    """The entries of ``task``'s checkpoint that are its own: a partition ``task.partition``
    of one of ``changelogs`` (those of its subtopology's stores now)."""
    return {
        tp: offset
        for tp, offset in offsets.items()
        if tp.partition == task.partition and tp.topic in changelogs
    }


def _assignment(data: Any) -> dict[int, frozenset[TaskId]]:
    """Consumer index -> tasks of an assignment document; ``DamagedStateError`` otherwise."""
    if not isinstance(data, dict):
        raise DamagedStateError(f"expected an object of consumers, got {type(data).__name__}")
    out: dict[int, frozenset[TaskId]] = {}
    for index, names in data.items():
        if not _is_index(index):
            raise DamagedStateError(f"consumer {index!r} is not an index")
        if not isinstance(names, list):
            raise DamagedStateError(f"consumer {index}: expected a list of task ids")
        tasks = [_task_of(n) if isinstance(n, str) else None for n in names]
        if not all(t is not None and _valid_task(t) for t in tasks):
            raise DamagedStateError(f"consumer {index}: not a list of task ids: {names!r:.200}")
        out[int(index)] = frozenset(t for t in tasks if t is not None)
    return out
