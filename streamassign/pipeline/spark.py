"""The Spark jobs: simulate, aggregate for the report, and evaluate standby candidates.

The only module of the package that imports ``pyspark`` (inside functions, so importing it is
free). Every job has the same shape: the driver parallelizes small work items (scenario numbers,
or (scenario, standbys) pairs), the executors run whole traces with the pure core
(``simulate.py``, ``standbys.py``) in ``mapPartitions``, and the rows become a DataFrame with an
explicit schema. There is no driver-side loop over scenarios.

Sessions: :func:`start_session` uses ``--master`` when given, the master of ``spark-submit`` when
launched by it, else ``local[*]``; the UI and console progress are off, logging is at WARN, and
local mode uses few shuffle partitions so that small jobs start fast, and this interpreter for
its Python workers (unless ``PYSPARK_PYTHON`` is set).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Final

from ..errors import ExecutorCodeError
from .runs import (
    MANIFEST,
    OTHER_CODE_LINE,
    REBALANCES,
    ROW_FILES,
    ROW_SHA256,
    SHIPPED_CODE_PREFIX,
    Code,
    check_executor_code,
    check_rows_read,
    files_for,
    is_local_master,
    is_remote,
    row_digests,
    row_files,
    this_code,
    unreadable_file,
    why_other_code,
    write_manifest,
)
from .signals import deferred_signals
from .simulate import COLUMNS, SimulationJob, simulate_scenario
from .standbys import PLAN_COLUMNS, PlanJob, evaluate_candidates

__all__ = [
    "RUN_COLUMNS",
    "aggregate",
    "read_manifest",
    "row_schema",
    "run_plan",
    "run_simulation",
    "ship_code",
    "spark_session",
    "start_session",
    "table_schema",
]

#: Columns the stored table adds in front of :data:`COLUMNS`, so that runs appended into one
#: table stay apart. The table is partitioned by ``assignor`` (Spark reads it back last).
RUN_COLUMNS: Final[tuple[tuple[str, str, bool, str], ...]] = (
    ("run_id", "string", False, "the run that wrote the row (its manifest's run_id)"),
    ("seed", "long", False, "base seed of the run's traces"),
)

_LOG4J: Final = Path(__file__).with_name("log4j2.properties")


def _under_spark_submit() -> bool:
    """Launched by ``spark-submit`` (which starts the JVM first and passes its gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


@contextmanager
def spark_session(
    master: str | None = None, app_name: str = "streamassign", ship: bool | None = False
) -> Iterator[Any]:
    """A quiet SparkSession for one command, stopped afterwards if this call started it.

    An active session (tests, notebooks, ``spark-submit`` scripts that made one) is reused and
    left running. ``ship``: :func:`ship_code` into a ``streamassign-code-*`` temporary folder
    (``None``: when :func:`wants_shipped_code`); the folder is removed once the session that
    serves it to the executors has stopped (for a reused session: at interpreter exit).
    """
    from pyspark.sql import SparkSession

    active = session = SparkSession.getActiveSession()
    bundle_dir = None
    try:
        if session is None:
            # A signal raised inside pyspark's JVM start leaves the JVM running for good
            # (its gateway thread waits for a connection): it waits until the session
            # exists, and then the stop below ends the JVM (a second signal ends at once).
            with deferred_signals():
                session = start_session(master, app_name)
            _quiet_accumulator_server(session)
        if wants_shipped_code(session, ship):
            bundle_dir = tempfile.mkdtemp(prefix="streamassign-code-")
            ship_code(session, bundle_dir)
        yield session
    except BaseException:
        if active is None and session is not None:
            # Stopping mid-job (Ctrl-C, a failure) makes running tasks log pages of expected
            # errors; the command reports the cause in one line. The JVM may be gone too (a
            # SIGTERM or SIGHUP to the whole process group): the cause raised is what counts,
            # not the Py4J errors of talking to it.
            with contextlib.suppress(Exception):
                session.sparkContext.setLogLevel("OFF")
            with contextlib.suppress(Exception):
                session.stop()
        raise
    else:
        if active is None:
            session.stop()
    finally:
        if bundle_dir is not None:
            if active is None:
                shutil.rmtree(bundle_dir, ignore_errors=True)
            else:  # the running session's executors may still fetch it
                atexit.register(shutil.rmtree, bundle_dir, ignore_errors=True)


def _quiet_accumulator_server(session: Any) -> None:
    """No trace from pyspark's accumulator server when the JVM goes away mid-update (an
    ``EOFError``): a signal to the whole process group stops the JVM too, and the command says
    so in one line (socketserver printed 25 lines before it). Other errors are printed."""
    server = getattr(session.sparkContext, "_accumulatorServer", None)
    if server is None:
        return
    report = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], EOFError):
            report(request, client_address)

    server.handle_error = handle_error


def start_session(master: str | None = None, app_name: str = "streamassign") -> Any:
    """Start (or get) a quiet SparkSession.

    ``master=None`` means the master ``spark-submit`` was given, else ``local[*]``.
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    chosen = master or (None if _under_spark_submit() else "local[*]")
    if chosen is not None:
        builder = builder.master(chosen)
    local = is_local_master(chosen or "")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers run this interpreter (its venv and packages), not the first python3
        # on the PATH, unless the user chose one. Read by the SparkContext at its start.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        cores = str(_local_cores(chosen or "local[*]"))
        builder = builder.config("spark.sql.shuffle.partitions", cores).config(
            "spark.default.parallelism", cores
        )
    if not _under_spark_submit():
        quiet = f"-Dlog4j2.configurationFile={_LOG4J.as_uri()}"
        builder = builder.config("spark.driver.extraJavaOptions", quiet)
    session = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "false" if local else "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.debug.maxToStringFields", "200")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session


def _local_cores(master: str) -> int:
    """Threads of a ``local[N]`` / ``local[*]`` / ``local`` master."""
    inside = master[len("local") :].strip("[]").split(",")[0]
    if inside in ("", "*"):
        return os.cpu_count() or 1
    try:
        return max(1, int(inside))
    except ValueError:
        return os.cpu_count() or 1


def row_schema() -> Any:
    """The Spark schema of :data:`streamassign.pipeline.simulate.COLUMNS`."""
    return _schema(COLUMNS)


def table_schema() -> Any:
    """The schema of a run's stored rows: :data:`RUN_COLUMNS`, then :data:`COLUMNS`."""
    return _schema((*RUN_COLUMNS, *COLUMNS))


def _schema(columns: Sequence[tuple[str, str, bool, str]]) -> Any:
    from pyspark.sql import types as T

    kinds = {
        "long": T.LongType(),
        "int": T.IntegerType(),
        "double": T.DoubleType(),
        "boolean": T.BooleanType(),
        "string": T.StringType(),
    }
    return T.StructType([T.StructField(n, kinds[k], nullable) for n, k, nullable, _ in columns])


def _simulate_partition(
    job: SimulationJob, counter: Any, driver: Code, scenarios: Iterator[int]
) -> Iterator[tuple[Any, ...]]:
    """Executor side: every row of every scenario in this partition, as tuples, by the code
    of the ``driver`` (whose fingerprint the manifest records) or none."""
    check_executor_code(driver)
    for scenario in scenarios:
        rows = simulate_scenario(job, scenario)
        if counter is not None:
            counter.add(len(rows))
        for row in rows:
            yield row.values()


#: At most this many work items (traces) per Spark task by default: progress (tasks done, rows
#: counted) moves only as a task finishes, so a large run gets more, shorter tasks.
ITEMS_PER_TASK: Final = 100


def _slices(spark: Any, items: int, spark_tasks: int | None = None) -> int:
    """Spark tasks (partitions) for ``items`` work items: ``spark_tasks`` if given, else several
    per core so that slow traces even out, and enough that no task holds more than
    :data:`ITEMS_PER_TASK` items, up to 64 per core (each task writes a Parquet file per
    assignor: a million traces would otherwise be 50,000 files); never more than the items."""
    cores = int(spark.sparkContext.defaultParallelism)
    wanted = spark_tasks or min(64 * cores, max(4 * cores, -(-items // ITEMS_PER_TASK)))
    return max(1, min(items, wanted))


def run_simulation(
    spark: Any,
    job: SimulationJob,
    out: str,
    manifest: dict[str, Any],
    run_id: str = "run",
    counter: Any = None,
    spark_tasks: int | None = None,
) -> int:
    """Simulate every scenario of ``job`` on the executors; write ``out/rebalances`` (Parquet,
    partitioned by assignor, with ``run_id`` and ``seed`` columns) and then, last,
    ``out/manifest`` (one JSON line; for a local ``out``, listing the Parquet files written
    with their sizes and digests: ``runs.ROW_FILES``, ``runs.ROW_SHA256``). ``out`` must not
    hold rows yet: callers write into a fresh folder and publish it (``runs.publish``).
    ``counter``: a fresh int accumulator to count rows in (progress can read it as tasks
    finish). ``spark_tasks``: how many Spark tasks share the scenarios (default:
    ``_slices``). Returns the rows written."""
    from pyspark.sql import functions as F

    sc = spark.sparkContext
    counter = sc.accumulator(0) if counter is None else counter
    slices = _slices(spark, job.scenarios, spark_tasks)
    rdd = sc.parallelize(range(job.scenarios), slices).mapPartitions(
        partial(_simulate_partition, job, counter, this_code())
    )
    frame = spark.createDataFrame(rdd, schema=row_schema(), verifySchema=False).select(
        F.lit(run_id).alias("run_id"), F.lit(job.seed).cast("long").alias("seed"), "*"
    )
    with _said_as_executor_code_error(spark):
        frame.write.mode("errorifexists").partitionBy("assignor").parquet(_join(out, REBALANCES))
    # Counted from the files (their footers, not the rows): the accumulator (progress) counts
    # a task run twice (a retry, a speculative copy) twice, and the report checks the files
    # against this count.
    written = int(spark.read.parquet(_join(out, REBALANCES)).count())
    files = files_for(out, spark)
    full = {**manifest, "run_id": run_id, "rows": written}
    if not is_remote(out):  # a remote run is never kept, and Hadoop lists ~10 ms per file
        full[ROW_FILES], full[ROW_SHA256] = row_files(files, out), row_digests(out)
    write_manifest(files, out, full)
    return written


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def read_manifest(spark: Any, run_dir: str) -> dict[str, Any]:
    """The manifest a simulation wrote (empty when the directory has none)."""
    from pyspark.errors import AnalysisException

    try:
        first = spark.read.text(_join(run_dir, MANIFEST)).first()
    except AnalysisException:
        return {}
    loaded: dict[str, Any] = json.loads(first[0]) if first is not None else {}
    return loaded


# -- the report's aggregates ---------------------------------------------------------------------

#: Columns summarised with quantiles in the CSV summaries: (column, statistics).
_QUANTILES: Final = (0.5, 0.9, 0.99)
SUMMARY_METRICS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("moves", ("mean", "p50", "p90", "p99", "max")),
    ("excess_moves", ("mean", "p99", "max")),
    ("active_imbalance", ("mean", "p90", "max")),
    ("load_imbalance", ("mean", "p90", "max")),
    ("subtopology_imbalance", ("mean", "max")),
    ("standby_coverage", ("mean", "min")),
    ("records_to_restore", ("mean", "p50", "p90", "p99", "max")),
    ("max_task_restore", ("p50", "p99", "max")),
    ("split_tasks", ("mean", "max")),
    ("assign_ms", ("mean", "p50", "p99", "max")),
)


#: Runs of more rows than this get approximate percentiles (``percentile_approx`` at its default
#: accuracy 10,000: the value returned has a rank within 1/10,000 of the group's rows of the
#: exact one): the exact ones keep every distinct value of a group in memory, which a 10M-row
#: run cannot afford on the default driver memory (docs/pipeline.md).
EXACT_PERCENTILE_ROWS: Final = 1_000_000

#: Summed columns of the CSV summaries: (column, name in the summary).
_TOTALS: Final = (
    ("moves", "moves_total"),
    ("move_lower_bound", "bound_total"),
    ("warm_takeovers", "warm_takeovers"),
    ("cold_takeovers", "cold_takeovers"),
    ("records_to_restore", "records_total"),
    ("unassigned", "unassigned_total"),
)


def _mean(column: str) -> Any:
    from pyspark.sql import functions as F

    return F.avg(column).alias(f"{column}_mean")


def _sums(*columns: str) -> list[Any]:
    """The sum of each column, under the column's name."""
    from pyspark.sql import functions as F

    return [F.sum(c).alias(c) for c in columns]


def _collect(frame: Any) -> list[dict[str, Any]]:
    return [r.asDict() for r in frame.collect()]


def _summary_columns(frame: Any, keys: Sequence[str], exact: bool = True) -> Any:
    """Per group of ``keys``: counts, rates, sums and the quantiles of :data:`SUMMARY_METRICS`
    (exact, or ``percentile_approx`` when not ``exact``)."""
    from pyspark.sql import functions as F

    percentile = F.percentile if exact else F.percentile_approx

    ok = frame.where(F.col("error").isNull()).withColumn(
        "excess_moves", F.col("moves") - F.col("move_lower_bound")
    )
    fixed = {
        "rebalances": F.count(F.lit(1)),
        "balanced_share": F.avg(F.col("active_balanced").cast("double")),
        "subtopology_balanced_share": F.avg(F.col("subtopology_balanced").cast("double")),
        "optimal_moves_share": F.avg((F.col("moves") == F.col("move_lower_bound")).cast("double")),
        **{name: F.sum(column) for column, name in _TOTALS},
    }
    aggs = [expr.alias(name) for name, expr in fixed.items()]
    for column, stats in SUMMARY_METRICS:
        quantiles = [s for s in stats if s.startswith("p")]
        if quantiles:
            levels = [int(s[1:]) / 100 for s in quantiles]
            aggs.append(percentile(F.col(column).cast("double"), levels).alias(f"{column}__q"))
        for s in stats:
            if s == "mean":
                aggs.append(_mean(column))
            elif s == "max":
                aggs.append(F.max(column).cast("double").alias(f"{column}_max"))
            elif s == "min":
                aggs.append(F.min(column).cast("double").alias(f"{column}_min"))
    grouped = ok.groupBy(*keys).agg(*aggs)
    selected = [F.col(c) for c in (*keys, *fixed)]
    for column, stats in SUMMARY_METRICS:
        quantiles = [s for s in stats if s.startswith("p")]
        for s in stats:
            if s in quantiles:
                selected.append(F.col(f"{column}__q")[quantiles.index(s)].alias(f"{column}_{s}"))
            else:
                selected.append(F.col(f"{column}_{s}"))
    return grouped.select(*selected).orderBy(*keys)


def _outcomes(churn: Any) -> Any:
    """Per (level, assignor), the report's answer section: what the HA assignor did between
    events (warmups, probing rebalances, time to balance) and how often joins were split."""
    from pyspark.sql import functions as F

    ok = churn.where(F.col("error").isNull())
    return (
        ok.groupBy("level", "assignor")
        .agg(
            F.countDistinct("scenario").alias("scenarios"),
            F.sum("warmups").alias("warmups_total"),
            F.sum("probing_rebalances").alias("probing_rebalances_total"),
            F.avg("balanced_after_s").alias("balanced_after_s_mean"),
            F.max("balanced_after_s").alias("balanced_after_s_max"),
            F.sum(F.col("balanced_after_s").isNull().cast("int")).alias("never_balanced"),
            F.avg((F.col("split_tasks") > 0).cast("double")).alias("split_share"),
            F.sum("standby_restore_records").alias("standby_restore_total"),
        )
        .orderBy("level", "assignor")
    )


def aggregate(spark: Any, run_dir: str) -> dict[str, Any]:
    """Everything the report shows, aggregated on Spark and collected as plain Python values.

    Keys: ``by_event`` and ``by_assignor`` (summary rows, dicts in column order), ``by_step``
    (means per assignor and step), ``outcomes`` (per assignor: warmups, probing rebalances, time
    to balance — ``never_balanced`` counts rebalances not balanced before the next event —, the
    share of rebalances splitting a joined task, standby copies), ``errors`` (per assignor:
    count and first message),
    ``manifest``, ``columns`` (CSV column order of the summaries), ``exact_percentiles``
    (False past :data:`EXACT_PERCENTILE_ROWS` rows: approximate ones). A run file that cannot
    be read (its bytes changed) is a :class:`DamagedRunError` naming it.
    """
    try:
        return _aggregate(spark, run_dir)
    except Exception as exc:
        damage = unreadable_file(run_dir, _failure_text(exc))
        if damage is None:
            raise
        raise damage from exc


def _aggregate(spark: Any, run_dir: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    manifest = read_manifest(spark, run_dir)
    frame = spark.read.parquet(_join(run_dir, REBALANCES))
    rows = manifest.get("rows")
    if not isinstance(rows, int):
        rows = frame.count()
    exact = rows <= EXACT_PERCENTILE_ROWS
    # Caching pays for small runs (several passes, memory to spare); a large one is re-read.
    frame = frame.cache() if exact else frame
    try:
        by_event = _summary_columns(frame, ["level", "assignor", "event"], exact)
        collected = {"by_event": _collect(by_event), "errors": _collect(_errors(frame))}
        # Before the rest: a damaged run is refused without aggregating all of it.
        _check_rows_read(run_dir, manifest, collected["by_event"], collected["errors"])
        churn = frame.where(F.col("event") != "initial")
        by_assignor = _summary_columns(churn, ["level", "assignor"], exact)
        summaries = {"by_event": by_event, "by_assignor": by_assignor, "by_step": _by_step(frame)}
        collected |= {name: _collect(summaries[name]) for name in ("by_assignor", "by_step")}
        return {
            **collected,
            "outcomes": _collect(_outcomes(churn)),
            "manifest": manifest,
            "columns": {name: summary.columns for name, summary in summaries.items()},
            "exact_percentiles": exact,
        }
    finally:  # a refused run too: a cached table would be read again for the next report
        frame.unpersist()


def _failure_text(exc: BaseException) -> str:
    """``exc``'s message and those of what it came from, with their Java traces (pyspark keeps
    a Java cause as ``_cause``, a trace as ``_stackTrace``): where a read failure's file and
    cause are written."""
    parts: list[str] = []
    link: BaseException | None = exc
    for _ in range(20):
        if link is None:
            break
        trace = getattr(link, "_stackTrace", None)
        parts += [str(link), trace if isinstance(trace, str) else ""]
        cause = getattr(link, "_cause", None) or link.__cause__
        link = cause if isinstance(cause, BaseException) else None
    return "\n".join(parts)


@contextmanager
def _said_as_executor_code_error(spark: Any) -> Iterator[None]:
    """A job whose task failed with :class:`ExecutorCodeError` raises it as itself."""
    try:
        yield
    except Exception as exc:
        if _executor_code_line(exc) is None:
            raise  # Spark is asked how it runs its workers only for this error
        other_code = _executor_code_error(exc, _ships_code(spark), _local_master(spark))
        assert other_code is not None  # its line was found
        raise other_code from exc


def _executor_code_error(
    exc: BaseException, shipped: bool, local_master: bool
) -> ExecutorCodeError | None:
    """The :class:`ExecutorCodeError` a task failed with, as one line on the driver (Spark
    wraps it in its job's trace), or None if ``exc`` is another failure. The cause is worked
    out here (``runs.why_other_code``) from the worker's package folder: the worker runs other
    code, which may word its own cause otherwise, or wrongly."""
    line = _executor_code_line(exc)
    if line is None:
        return None
    said = OTHER_CODE_LINE.match(line)
    if said is None:  # a line this code cannot read: the worker's own, as it is
        return ExecutorCodeError(line)
    cause = why_other_code(said["where"], this_code(), shipped, local_master)
    return ExecutorCodeError(f"{said[1]}: {cause}")


def _executor_code_line(exc: BaseException) -> str | None:
    """The last :class:`ExecutorCodeError` line in ``exc``'s chain of failures, or None."""
    found = re.findall(rf"{ExecutorCodeError.__name__}: (.+)", _failure_text(exc))
    return found[-1].strip() if found else None


def _ships_code(spark: Any) -> bool:
    """Whether the session serves :func:`ship_code`'s zip to its executors."""
    try:
        return any(SHIPPED_CODE_PREFIX in f for f in spark.sparkContext.listFiles)
    except Exception:  # a session already stopped: the cause then names no remedy of shipping
        return False


def _local_master(spark: Any) -> bool:
    """Whether the session's workers run on this machine (``local``, ``local[*]``, ...)."""
    try:
        return is_local_master(str(spark.sparkContext.master))
    except Exception:  # a session already stopped: then not known to share our files
        return False


def _check_rows_read(
    run_dir: str,
    manifest: dict[str, Any],
    by_event: list[dict[str, Any]],
    errors: list[dict[str, Any]],
) -> None:
    """``runs.check_rows_read`` on the rows the summaries counted: every row is in
    ``by_event`` (initial steps included) or, when it failed, in ``errors``."""
    rows_read = sum(r["rebalances"] for r in by_event) + sum(r["errors"] for r in errors)
    assignors_read = {str(r["assignor"]) for r in (*by_event, *errors)}
    check_rows_read(run_dir, manifest, rows_read, assignors_read)


def _by_step(frame: Any) -> Any:
    """Means per assignor and step, over rebalances without an error."""
    from pyspark.sql import functions as F

    return (
        frame.where(F.col("error").isNull())
        .groupBy("level", "assignor", "step")
        .agg(
            F.count(F.lit(1)).alias("rebalances"),
            *(
                _mean(c)
                for c in (
                    "clients",
                    "moves",
                    "move_lower_bound",
                    "active_imbalance",
                    "load_imbalance",
                    "standby_coverage",
                )
            ),
            F.min("standby_coverage").alias("standby_coverage_min"),
            _mean("records_to_restore"),
        )
        .orderBy("level", "assignor", "step")
    )


def _errors(frame: Any) -> Any:
    """Per assignor: the count of failed rebalances and the first message."""
    from pyspark.sql import functions as F

    return (
        frame.where(F.col("error").isNotNull())
        .groupBy("assignor")
        .agg(F.count(F.lit(1)).alias("errors"), F.min("error").alias("example"))
        .orderBy("assignor")
    )


# -- plan-standbys ---------------------------------------------------------------------------------


def _plan_partition(
    job: PlanJob, driver: Code, items: Iterator[tuple[int, int]]
) -> Iterator[tuple[Any, ...]]:
    """Executor side: each (scenario, standbys) item's rows, one per warmup candidate, by the
    ``driver``'s code or none (a plan of other code would be said as this code's)."""
    check_executor_code(driver)
    for scenario, standbys in items:
        yield from evaluate_candidates(job, scenario, standbys)


def run_plan(spark: Any, job: PlanJob, spark_tasks: int | None = None) -> list[dict[str, Any]]:
    """Run every (scenario, standby candidate) on the executors and aggregate per candidate.

    Returns one dict per (standbys, warmups) candidate with the expected availability, outage
    quantiles and load (see ``standbys.summarize`` for the formulas), sorted by candidate.
    ``spark_tasks`` as in :func:`run_simulation`.
    """
    from pyspark.sql import functions as F

    items = [(s, r) for s in range(job.scenarios) for r in job.standby_candidates]
    slices = _slices(spark, len(items), spark_tasks)
    rdd = spark.sparkContext.parallelize(items, slices).mapPartitions(
        partial(_plan_partition, job, this_code())
    )
    frame = spark.createDataFrame(rdd, schema=_schema(PLAN_COLUMNS), verifySchema=False)
    grouped = frame.groupBy("standbys", "warmups").agg(
        F.count(F.lit(1)).alias("traces"),
        *_sums(
            "horizon_s",
            "task_seconds",
            "unavailable_task_seconds",
            "restore_outage_s",
            "detection_outage_s",
            "restart_outage_s",
        ),
        F.percentile("worst_outage_s", [0.5, 0.99]).alias("worst_q"),
        F.max("worst_outage_s").alias("worst_outage_max_s"),
        *_sums(
            "restore_records",
            "standby_task_seconds",
            "standby_bootstrap_records",
            "warmup_task_seconds",
            "deferred_moves",
            "convergence_s",
            "planned_rebalances",
        ),
    )
    rows = []
    with _said_as_executor_code_error(spark):
        collected = grouped.orderBy("standbys", "warmups").collect()
    for r in collected:
        d = r.asDict()
        q = d.pop("worst_q")
        d["worst_outage_p50_s"], d["worst_outage_p99_s"] = float(q[0]), float(q[1])
        rows.append(d)
    return rows


# -- shipping the code to a cluster ----------------------------------------------------------------


def ship_code(spark: Any, workdir: str | Path) -> Path:
    """Zip the pure-Python packages the executors need (``streamassign`` and ``attrs``) and add
    the zip to the job (``SparkContext.addPyFile``), so that a cluster whose executors have only
    Python and pyspark runs the job. Returns the zip's path (under ``workdir``)."""
    import secrets
    import zipfile

    import attr
    import attrs

    import streamassign

    # A name of its own: Spark refuses a second file of the same name from another path.
    target = Path(workdir) / f"{SHIPPED_CODE_PREFIX}{secrets.token_hex(4)}.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for module in (streamassign, attr, attrs):
            root = Path(module.__file__ or "").parent
            for path in sorted(root.rglob("*")):
                if "__pycache__" in path.parts or not path.is_file():
                    continue
                zf.write(path, path.relative_to(root.parent).as_posix())
    spark.sparkContext.addPyFile(str(target))
    return target


def wants_shipped_code(spark: Any, ship: bool | None) -> bool:
    """``--ship-code`` as given, else on for every master but local mode."""
    if ship is not None:
        return ship
    return not is_local_master(str(spark.sparkContext.master))
