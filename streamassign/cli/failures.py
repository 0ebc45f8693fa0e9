"""A pipeline command's failure in one line: Spark's and Py4J's traces reduced to their cause."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import click

from ..errors import ExecutorCodeError, StreamAssignError


def _spark_failure(exc: BaseException) -> str:
    """One line out of a Spark/Py4J failure: the innermost Python exception line, or the
    outermost Java exception with its innermost cause (Spark's ``TASK_WRITE_FAILED`` says what
    was written; its cause, ``java.io.IOException: No space left on device``, says why)."""

    text = str(exc)
    python = re.findall(r"^(\w*(?:Error|Exception)\b.*)$", text, re.MULTILINE)
    if python:  # the innermost Python error of a task (Python traces end with it)
        return str(python[-1]).strip()[:300]
    java = re.search(r"(?:\w+\.)+(\w*(?:Exception|Error)): (.*)", text)
    if java:  # the outermost Java exception: its class and message
        outer = f"{java.group(1)}: {java.group(2).strip()}"[:300]
    else:
        outer = (text.strip().splitlines()[0] if text.strip() else type(exc).__name__)[:300]
    cause = _innermost_cause(exc)
    return f"{outer} (cause: {cause})" if cause and cause not in outer else outer


def _innermost_cause(exc: BaseException) -> str | None:
    """The deepest cause under ``exc`` as one line of at most 200 characters: a chained Python
    exception (``raise ... from``), else the last ``Caused by:`` of a Java trace (its innermost:
    a suppressed exception's are indented), else the first line of a chained Java exception
    (pyspark keeps a Java cause as ``_cause``, its trace as ``_stackTrace``); None if none."""

    chain = _exception_chain(exc)
    innermost = chain[-1]
    if innermost is not exc and not type(innermost).__module__.startswith(("py4j", "pyspark")):
        return f"{type(innermost).__name__}: {innermost}".splitlines()[0][:200]
    for link in reversed(chain):
        trace = getattr(link, "_stackTrace", None)
        text = trace if isinstance(trace, str) else str(link)
        causes = re.findall(r"^Caused by: (.+)$", text, re.MULTILINE)
        if causes:
            return str(causes[-1]).strip()[:200]
        if link is not exc and text.strip():
            return text.strip().splitlines()[0][:200]
    return None


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it came from, outermost first: ``raise ... from``'s ``__cause__`` or
    pyspark's ``_cause`` (at most 20, each once). Not ``__context__``: an exception being
    handled when this one was raised need not be why."""
    chain = [exc]
    while len(chain) < 20:
        link = chain[-1]
        below = link.__cause__ or getattr(link, "_cause", None)
        if not isinstance(below, BaseException) or any(below is seen for seen in chain):
            break
        chain.append(below)
    return chain


@contextlib.contextmanager
def _one_line_failures(
    doing: str, kept: str | None = None, done: str | None = None
) -> Iterator[None]:
    """Spark failures and Ctrl-C, SIGTERM or SIGHUP as one line (what failed, what was kept,
    what was done before), not a trace; after a signal the exit status is 128 + its number
    (130 after Ctrl-C). A ``KeyboardInterrupt(signum, left)`` says ``left`` instead of
    ``kept``; ``done`` (a run complete before its report failed) is said whatever happened,
    and with it any failure is one line (its type and message), not only Spark's."""
    import signal

    from ..pipeline.signals import interrupt_on_signals, quiet_py4j

    after = f"; {done}" if done else ""
    tail = (f"; {kept}" if kept else "") + after
    try:
        # py4j's traces of talking to a JVM the signal stopped too (the whole process group
        # got it) would bury the one line; undone when the command ends.
        with quiet_py4j(), interrupt_on_signals():
            yield
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
        by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
        if len(exc.args) > 1:  # what the interrupted step left, where it knows better
            tail = f"; {exc.args[1]}{after}"
        click.echo(f"interrupted{by} while {doing}{tail}", err=True)
        raise SystemExit(128 + signum) from None
    except ExecutorCodeError as exc:  # the driver's one line of a task's failure
        raise click.ClickException(f"{doing} failed: {exc}{tail}") from exc
    except (click.ClickException, StreamAssignError, SystemExit):
        raise
    except Exception as exc:
        if _from_spark(exc):
            reason = _spark_failure(exc)
        elif done is not None:
            # A complete run behind it: its one line (and the command that writes the report,
            # with the trace if it fails again) matters more than this failure's trace.
            reason = f"{type(exc).__name__}: {exc}"[:300]
        else:
            raise
        raise click.ClickException(f"{doing} failed: {reason}{tail}") from exc


def _from_spark(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.startswith(("py4j", "pyspark")) or isinstance(exc, ConnectionError)
