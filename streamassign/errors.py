"""Typed errors raised by the assignment core.

Every error names what is wrong (topics, counts, process ids) so that an operator reading a log
line knows what to fix, and integrations can map each type to a protocol error code.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Iterable, Mapping


class StreamAssignError(Exception):
    """Base class of every error this library raises on purpose."""


class TopologyError(StreamAssignError, ValueError):
    """The topology itself is invalid or cannot be resolved (e.g. a repartition cycle)."""


class MissingTopicsError(TopologyError):
    """Source topics of the topology are absent from the partition counts (not created yet)."""

    def __init__(self, topics: Iterable[str]) -> None:
        self.topics: tuple[str, ...] = tuple(sorted(set(topics)))
        super().__init__(
            "missing source topics (no partition count known): " + ", ".join(self.topics)
        )


class CopartitioningError(TopologyError):
    """Topics that must be co-partitioned have different partition counts.

    ``counts`` maps every topic of the offending group to its partition count.
    """

    def __init__(self, counts: Mapping[str, int], reason: str = "") -> None:
        self.counts: dict[str, int] = dict(sorted(counts.items()))
        listed = ", ".join(f"{topic}:{n}" for topic, n in self.counts.items())
        detail = f" ({reason})" if reason else ""
        super().__init__(f"topics not co-partitioned{detail}: {listed}")


class InvalidPartitionCountsError(TopologyError):
    """Partition counts of topics the topology reads are not integers >= 1.

    ``counts`` maps each offending topic to the value it was given.
    """

    def __init__(self, counts: Mapping[str, object]) -> None:
        self.counts: dict[str, object] = dict(sorted(counts.items()))
        listed = ", ".join(f"{topic}:{n!r}" for topic, n in self.counts.items())
        super().__init__(f"partition counts must be integers >= 1: {listed}")


class RepartitionResolutionError(TopologyError):
    """The partition count of a computed repartition topic cannot be determined.

    Either computed counts form a cycle (``cycle`` is true; ``chain`` goes around it in data-flow
    order, first == last) or a computed repartition topic has no writer (``chain`` starts with it
    and follows the topics downstream whose counts it blocks).
    """

    def __init__(self, message: str, chain: Iterable[str], cycle: bool) -> None:
        self.chain: tuple[str, ...] = tuple(chain)
        self.cycle = cycle
        super().__init__(message)


class TopologyTypeError(TopologyError, TypeError):
    """A topology field of the wrong type (a name that is not a ``str``, a single string where a
    list of names belongs, a subtopology that is not a ``Subtopology``). A ``TopologyError`` and,
    as plain Python raised here before, a ``TypeError``."""


class NotInTopologyError(StreamAssignError, KeyError):
    """A lookup on a ``Topology`` of a subtopology id, store or topic it does not have; the
    message names the missing key (and the known ids). A ``KeyError``, as before."""


# -- identifiers -----------------------------------------------------------------------------------


class InvalidTaskIdError(StreamAssignError, ValueError):
    """Text that is not a task id (``"s_p"``, e.g. ``"0_3"``); the message quotes it."""


class TaskIdTypeError(StreamAssignError, TypeError):
    """A value that cannot be a task id: neither a ``TaskId``, ``"s_p"`` text, nor a pair of
    integers; the message shows it."""


# -- assignor input (sticky, high-availability, thread split) -------------------------------------


class AssignmentInputError(StreamAssignError, ValueError):
    """Input the task assignors, the thread split or the consumer partition assignors cannot
    work with: an option or a client field out of range (``capacity``, a lag,
    ``num_standby_replicas``, a partition count)."""


class AssignmentTypeError(StreamAssignError, TypeError):
    """An assignor input of the wrong type (e.g. a process id that is not a ``str``, one topic
    name where a collection of names belongs)."""


class DuplicateProcessIdError(AssignmentInputError):
    """Two clients of one group report the same process id; ``process_id`` names it."""

    def __init__(self, process_id: str) -> None:
        self.process_id = process_id
        super().__init__(f"duplicate process id among clients: {process_id!r}")


class NoClientsError(AssignmentInputError):
    """Tasks to assign but no client to run them; ``tasks`` is how many."""

    def __init__(self, tasks: int) -> None:
        self.tasks = tasks
        super().__init__(f"no clients to run {tasks} tasks")


class ThreadListError(AssignmentInputError):
    """The thread list of one client is empty or names a thread twice."""


class InvalidClientError(AssignmentInputError, AssignmentTypeError):
    """A ``ClientState`` field has the wrong type or value; the message names the field (and the
    offending key of ``lags`` / ``tags``). A ``ValueError`` and a ``TypeError``, so code catching
    either (what plain Python raised here before) keeps working."""


class ClientsFileError(StreamAssignError, ValueError):
    """A clients TOML file cannot be read or holds an invalid client; the message names the
    file, the client and the key."""


class DamagedStateError(StreamAssignError, ValueError):
    """Local state (a checkpoint, the last assignment, the process id, a RocksDB store whose
    files are corrupt or missing) that cannot be read or is implausible. Handled inside the
    library: the state is set aside and counts as none (a store is restored from its
    changelog), so users see a log line, not this error."""


class MissingExtraError(StreamAssignError, ModuleNotFoundError):
    """A feature needs a package of an optional extra that is not installed; the message names
    the extra (``pip install 'streamassign[EXTRA]'``). A ``ModuleNotFoundError`` (an
    ``ImportError``) whose ``name`` is the missing module, as the bare error it replaces, so
    code catching that still does."""


class ExtraVersionError(MissingExtraError):
    """A package of an optional extra is installed in a version below the extra's floor (an
    aiokafka 0.13 where the runtime needs 0.14): the import fails at once, naming the installed
    version, the range the extra installs and the pip command, rather than later with an error
    from deep inside. ``installed`` is the version found, ``needed`` the range (``>=0.14,<0.15``);
    a ``MissingExtraError`` too, since installing the extra is the remedy for both."""

    def __init__(
        self, message: str, *, name: str | None = None, installed: str = "", needed: str = ""
    ) -> None:
        super().__init__(message, name=name)
        self.installed = installed
        self.needed = needed


def require_extra(feature: str, extra: str, packages: Mapping[str, str], instead: str = "") -> None:
    """Raise ``MissingExtraError`` naming ``extra`` when a package ``feature`` needs is not
    installed: ``packages`` maps each top-level module to the requirement pip installs it from,
    as the extra lists it (``"aiokafka>=0.14,<0.15"``, or a bare distribution name); ``instead``:
    what else the user may do. A module missing inside an installed package is not the extra's:
    raised as it is. A version below the requirement's ``>=`` floor raises ``ExtraVersionError``;
    one above its ceiling passes (it may work; pip warned when it was installed), as does a
    distribution whose installed version pip's metadata does not tell."""
    install = f"pip install 'streamassign[{extra}]'" + (f" (or {instead})" if instead else "")
    for module, requirement in packages.items():
        distribution, needed = _split_requirement(requirement)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            raise MissingExtraError(
                f"{feature} needs {distribution}, from the {extra} extra: {install}", name=module
            ) from exc
        floor = _floor(needed)
        installed = None if floor is None else installed_version(distribution)
        if installed is not None and floor is not None and _below(installed, floor):
            raise ExtraVersionError(
                f"{feature} needs {distribution}{needed}, from the {extra} extra, but "
                f"{distribution} {installed} is installed: {install}",
                name=module,
                installed=installed,
                needed=needed,
            )


def _split_requirement(requirement: str) -> tuple[str, str]:
    """``"aiokafka>=0.14,<0.15"`` as its distribution and its range: ``("aiokafka",
    ">=0.14,<0.15")``."""
    distribution = re.match(r"[A-Za-z0-9._-]*", requirement)
    assert distribution is not None  # matches the empty string at least
    return distribution.group(), requirement[distribution.end() :].replace(" ", "")


def _floor(needed: str) -> str | None:
    """The ``>=`` floor of range ``needed`` (``">=0.14,<0.15"``), None without one."""
    floors = [bound[2:] for bound in needed.split(",") if bound.startswith(">=")]
    return floors[0] if floors else None


def installed_version(distribution: str) -> str | None:
    """The version pip's metadata gives ``distribution``, None without metadata (a package put
    on the path by hand)."""
    # Imported here, not with this module: importlib.metadata brings email, csv, zipfile and
    # more, about 20 ms, which a plain ``import streamassign`` (no extra) never needs.
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _below(installed: str, floor: str) -> bool:
    """Whether version ``installed`` is below ``floor``, as pip orders versions (a pre-release
    or development version of a release is below it, an epoch above every version without
    one); an installed version pip could not order (a fork's own scheme) is not judged."""
    # Imported here: only an extra's import with a floor to check needs it (about 4 ms).
    from packaging.version import InvalidVersion, Version

    try:
        return Version(installed) < Version(floor)
    except InvalidVersion:
        return False


# -- wire formats (Kafka Streams and consumer user data) -------------------------------------------


class ProtocolError(StreamAssignError, ValueError):
    """User data that cannot be decoded: garbage, truncated, or an unknown version (Kafka
    Streams' subscription and assignment info, Faust's JSON metadata)."""


class UserDataError(StreamAssignError, ValueError):
    """Subscription user data of the consumer protocol (``streamassign.consumer``) that cannot be
    decoded (garbage, truncated, unknown version)."""


class EncodeError(StreamAssignError, ValueError):
    """A value that cannot be written into user data: outside the wire's integer range, more
    entries than readers accept, or contradictory (a task active on two hosts)."""


class AssignmentValidationError(StreamAssignError):
    """An assignment that aiokafka would choke on (a bug in an assignor: never sent)."""


# -- processes and pipelines -----------------------------------------------------------------------


class ConfigError(StreamAssignError, ValueError):
    """An option of a process host that cannot work (e.g. ``threads < 1``, no application id,
    an unknown assignor name); the message names the option and the value."""


class ConfigTypeError(ConfigError, TypeError):
    """An option of the wrong type (e.g. a capacity that is not an int)."""


class NoTasksError(TopologyError, ConfigError):
    """A topology with no subtopology (no task to assign or run: an empty or half-written
    file) given to ``plan``, ``simulate``, ``App`` or ``ProcessHost``. Also a ``ConfigError``:
    ``App`` and ``ProcessHost`` refused an unnamed empty topology with one before (no
    application id), and ``except ConfigError`` around them keeps catching it."""


class StateDirectoryError(StreamAssignError, OSError):
    """The state directory cannot be created or opened (a file in its place, no permission, an
    I/O error): the operator's to fix, so it is not set aside like damaged state. An
    ``OSError`` too, as the error it replaces was."""


class StateDirectoryLockedError(StateDirectoryError):
    """Another live process holds the state directory."""


class PipelineError(StreamAssignError, ValueError):
    """A pipeline input is unusable (model parameters, assignor names, topology, paths).

    Raised on the driver before any Spark session starts; the message says what to change.
    """


class DamagedRunError(PipelineError):
    """A run directory whose rows no longer match its manifest: Parquet files deleted, moved or
    added since the run was written. The message names what is missing (no Parquet file at
    all, found before Spark starts; an assignor's rows, or a count of rows, found on reading).
    """


class ExecutorCodeError(StreamAssignError):
    """Spark's Python workers import other streamassign code than the command that started
    the job (a ``streamassign`` package in the working directory comes first on their path,
    the executors' own install, files changed meanwhile), so the rows would not come from the
    code the run's manifest names. Raised by the first task of each worker, and by the driver
    as one line naming both packages, their fingerprints, and the cause and remedy it works
    out from the worker's package folder."""


class PublishError(StreamAssignError, OSError):
    """A complete run or report that could not be moved into place (a rename that failed).
    The new one's staging folder is deleted; ``where`` says where the one it was to replace is
    now, as the folders show it: in place, or aside under a ``.replaced-`` name, or split
    between the two (an object store's rename failed partway), with what to do."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(f"{message}; {where}")
        self.where = where


# -- runtime (``streamassign.runtime``) -----------------------------------------------------------


class StoreKeyTypeError(StreamAssignError, TypeError):
    """A store key that is not ``bytes`` (often a record without a key written to a table)."""


class ReservedKeyError(StreamAssignError, ValueError):
    """A store key collides with the runtime's commit marker key (``runtime.COMMIT_KEY``)."""


class StoreNotOpenError(StreamAssignError):
    """A store of the runtime was used before its open (in a thread) finished, or its open
    failed (the cause says why: e.g. a RocksDB directory that cannot be read)."""


class StoreIOError(StreamAssignError):
    """A RocksDB store of the runtime cannot be opened for a reason that is not damage (held by
    another process, no permission, a full disk), or a read, write or close of it failed (a
    full disk, an I/O error); the message names the store's directory and RocksDB's status."""


class ErrorCode(enum.IntEnum):
    """Why an assignment is empty, carried in assignment user data (so members log the cause
    and retry with backoff instead of crash-looping)."""

    NONE = 0
    INCOMPLETE_SOURCE_TOPIC_METADATA = 1
    ASSIGNMENT_ERROR = 2
    SHUTDOWN_REQUESTED = 3


class TopologyVersionMismatchError(StreamAssignError):
    """The group's leader runs another topology version whose subtopology ids mean other
    source topics than here (an id reused across versions in a rolling deploy): the tasks it
    assigns by those ids are not run here, their partitions are paused. Logged once per episode
    by the member (``ProcessHost``), never raised to the caller."""


class AssignmentFileError(StreamAssignError, ValueError):
    """A saved assignment (``plan --json`` output given to ``explain`` / ``diff``) is unreadable."""


class GroupDescribeError(StreamAssignError):
    """A live group that cannot be described: broker unreachable, group missing, bad answer."""


# -- interactive queries (streamassign.runtime.queries) -------------------------------------------


class QueryError(StreamAssignError):
    """A table query that could not be answered. ``status`` is the HTTP status the query
    server answers with, ``code`` a stable name for programs; ``retryable`` errors (503) may
    succeed a moment later (a rebalance under way), and carry ``retry_after`` seconds."""

    status = 500
    code = "query_failed"
    retryable = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class BadQueryError(QueryError, ValueError):
    """A query the server cannot read: no key or two keys, bad hex, a negative partition or
    ``max_lag``, a partition out of range."""

    status = 400
    code = "bad_request"


class UnknownTableError(QueryError, LookupError):
    """The application has no store of that name; the message lists the tables it has."""

    status = 404
    code = "unknown_table"


class QueryUnavailableError(QueryError):
    """No copy of the key's task can answer now (retryable): no owner known yet, the owner is
    restoring or moving (a rebalance), its process is unreachable, or every standby allowed is
    further behind than ``max_lag``. ``code`` says which of these it was."""

    status = 503
    retryable = True

    def __init__(
        self, message: str, *, code: str = "unavailable", retry_after: float = 1.0
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.code = code


# -- the runtime (streamassign.runtime) ------------------------------------------------------------


class RuntimeConfigError(ConfigError):
    """The application is configured inconsistently (e.g. a subtopology without processor, an
    unknown store kind, a timing that must be positive)."""


class InternalTopicError(StreamAssignError):
    """An internal topic cannot be created, or exists with another partition count."""


class MissingChangelogError(InternalTopicError):
    """A changelog the application's state depends on is missing: deleted (at a start with
    local state of it, or while running), or without the partitions its tasks need (source
    partitions added while running). Continuing would lose that state silently; the message
    names the topics and the remedy (docs/runtime.md)."""


class NotAuthorizedError(StreamAssignError):
    """The broker refused the runtime's principal an operation (an ACL is missing): the
    application does not start, or stops, since a retry would be refused again. The message
    names the resource, the operation to grant and the principal (docs/runtime.md,
    "Secured clusters")."""


class SourceTopicsNotAuthorizedError(MissingTopicsError, NotAuthorizedError):
    """Source topics the runtime's principal may not read (Kafka answers so whether they
    exist or not). A ``MissingTopicsError`` too: its partition counts are not known."""

    def __init__(self, topics: Iterable[str], message: str) -> None:
        self.topics = tuple(sorted(set(topics)))
        StreamAssignError.__init__(self, message)


class InternalTopicNotAuthorizedError(MissingChangelogError, NotAuthorizedError):
    """An internal topic (changelog, repartition topic) the runtime's principal may not
    describe or create. Never taken for a deleted changelog; a ``MissingChangelogError``
    too, so it stops the application wherever a missing changelog does."""


class GroupNotAuthorizedError(NotAuthorizedError):
    """The runtime's principal may not use the application's consumer group (READ)."""


class ChangelogReadTimeoutError(StreamAssignError, TimeoutError):
    """A changelog range the runtime must read (the keys another writer wrote before a
    commit marker) was not read within its deadline (the broker slow or away)."""


class ProcessingError(StreamAssignError):
    """A processor raised; the application stopped without committing the failed record."""


class UnknownStoreError(StreamAssignError, KeyError):
    """A processor asked its task for a store the topology does not give it."""


class TaskMovedError(StreamAssignError):
    """A processor wrote to a store of its task after the task moved away from the consumer
    running the record (to a sibling consumer, or revoked) while the processor awaited: the
    stores are another owner's now. Raised to the processor; the record is undone there and
    run by the task's new owner."""


class FanOutLimitError(StreamAssignError, ValueError):
    """One input record sent more repartition records than their ordering headers can number."""


class TransactionFailedError(StreamAssignError):
    """A task's transaction could not be begun or committed (its producer was fenced by a
    newer owner of the task, or failed): the runtime aborts it and drops the task's
    uncommitted state; the application goes on."""


class CommitRetriesExhaustedError(StreamAssignError):
    """A consumer's commits failed on a passing broker error (a leader away, too few
    in-sync replicas, an expired write) for longer than ``commits.RETRY_LIMIT``: the error
    did not pass, and the application stops rather than replay its input for good."""


class OutputWriteError(StreamAssignError):
    """A write the broker refuses for good (a record larger than its topic's
    ``max.message.bytes``, keyless to a compacted topic, an authorization failure): the
    application stops, since a retry or restart would be refused again. Exactly once, the
    task's transaction is aborted; a record known to be too large is never sent."""


class OutputNotAuthorizedError(OutputWriteError, NotAuthorizedError):
    """A write the runtime's principal may not make: to a topic it may not write to (WRITE),
    or, exactly once, in a transaction whose transactional id it may no longer use (WRITE on
    it, taken away while the application runs)."""


class WritesAbandonedError(StreamAssignError, ConnectionError):
    """What a producer whose stop did not end within ``closing.CLOSE_TIMEOUT`` (the broker
    unreachable) still held: its unsent and unacknowledged writes' futures fail with it, and
    they are never sent (``closing.release_producer``)."""


class EndOffsetsTimeoutError(StreamAssignError, TimeoutError):
    """No end offset of the partitions asked for was listed in time (each partition asked on
    its own after the call for all of them did not answer)."""


class TopicConfigError(StreamAssignError):
    """A topic's or broker's configuration (e.g. ``max.message.bytes``) that cannot be read
    or has no value; the message names the topic or broker."""


class ReassertionFailedError(OutputWriteError):
    """At least once: another writer's records landed before an owner's commit marker (which
    closed them too), and the owner could not write its pending values again after them; the
    application stops rather than let a restore apply the other writer's values over them."""


class ProducerStartError(StreamAssignError):
    """Exactly once: a task's transactional producer cannot start (a configuration the
    broker rejects, a missing authorization, or no transaction coordinator within the start
    timeout): the application stops rather than rejoining forever."""


class TransactionalIdNotAuthorizedError(ProducerStartError, NotAuthorizedError):
    """Exactly once: a task's transactional producer cannot start, since the runtime's
    principal may not use its transactional id (WRITE on ``<application id>-<task>``)."""


class StartStoppedError(StreamAssignError):
    """``stop()`` (or ``ProcessHost.begin_stop``) was called while ``App.start`` or
    ``ProcessHost.start`` was under way, or before it (an ``App`` cannot start again after
    ``stop()``): the start ends with it instead of waiting for a first assignment or for its
    clients' starts (for ever, while the broker is away); the stop closes what it made.
    ``App.run`` stopped so returns normally: the stop was asked for."""

    @classmethod
    def refusing_start(cls, what: str, started: bool, instead: str) -> StartStoppedError:
        """``start()`` of ``what`` once it was stopped: before any start, or after one
        (``started``; nothing restarts: ``instead`` says what to do)."""
        if not started:
            return cls(f"{what} was stopped before it started")
        return cls(f"{what} was stopped and cannot start again: {instead}")
