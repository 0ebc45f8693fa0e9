"""Ctrl-C, SIGTERM and SIGHUP under the pipeline's commands (:mod:`streamassign.pipeline.signals`):
deferred blocks, the handlers put back, py4j's traces kept off the screen."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Any

import pytest

from .conftest import ROOT


def test_after_a_signal_py4j_logs_no_trace_until_the_command_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A review's SIGHUP to the whole process group (the JVM stopped too) printed
    ``ERROR:root:Exception while sending command.`` and a 30-line trace before the one line:
    py4j logs on the root logger before raising what the cleanup suppresses. Another review:
    py4j stayed silent for good after the command, in an embedding notebook too."""
    import logging
    import os
    import signal

    from streamassign.cli.failures import _one_line_failures

    # What py4j's java_gateway.py does when its JVM is gone, from a file of its own.
    py4j_code = compile(
        "import logging\nlogging.exception('Exception while sending command.')",
        f"{os.sep}site-packages{os.sep}py4j{os.sep}java_gateway.py",
        "exec",
    )
    root, py4j = logging.getLogger(), logging.getLogger("py4j")
    filters, level = list(root.filters), py4j.level
    with pytest.raises(SystemExit), _one_line_failures("simulating"):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            _spin_until_a_signal()
        finally:  # the cleanup, talking to the JVM the signal stopped too
            exec(py4j_code)
            logging.getLogger("py4j.java_gateway").error("Could not connect")
    assert caplog.records == []
    assert (root.filters, py4j.level) == (filters, level)
    logging.getLogger("py4j.java_gateway").error("Could not connect")
    assert [r.getMessage() for r in caplog.records] == ["Could not connect"]


def _spin_until_a_signal(timeout_s: float = 10.0) -> None:
    """Runs Python code (where a signal's handler runs) until a handler raises."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pass
    pytest.fail(f"no handler raised within {timeout_s} s")


def test_a_second_signal_ends_a_deferred_block_at_once() -> None:
    """A review: a Spark start against a master that never answers (a minute, or for good
    on a busy YARN queue) could only be ended with ``kill -9``: every signal after the first
    was dropped until the block ended. (Under ``interrupt_on_signals``, as the CLI runs it.)"""
    import os
    import signal

    from streamassign.pipeline.signals import deferred_signals, interrupt_on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(KeyboardInterrupt) as raised, interrupt_on_signals(), deferred_signals():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        _spin_until_a_signal()
    assert raised.value.args == (signal.SIGTERM,)
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_second_sigterm_ends_a_library_callers_process() -> None:
    """Without the CLI's handlers, a second SIGTERM during a deferred block ends the process
    as SIGTERM does by default."""
    import signal

    code = (
        "import os, signal, time\n"
        "from streamassign.pipeline.signals import deferred_signals\n"
        "with deferred_signals():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "print('the block ran on')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr


def test_a_signal_is_not_lost_when_the_deferred_block_then_fails() -> None:
    """A review's SIGTERM to the whole process group while the JVM started stopped the JVM
    too: pyspark's ``JAVA_GATEWAY_EXITED`` came out instead of the signal, and the command
    said "simulating failed", exit status 1, not "interrupted by SIGTERM", 143."""
    import os
    import signal

    from streamassign.pipeline.signals import deferred_signals, interrupt_on_signals

    with pytest.raises(KeyboardInterrupt) as raised, interrupt_on_signals(), deferred_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        raise RuntimeError("JAVA_GATEWAY_EXITED")
    assert raised.value.args == (signal.SIGTERM,)
    assert isinstance(raised.value.__cause__, RuntimeError)


@pytest.mark.parametrize("when", ["install", "restore"])
def test_a_signal_while_handlers_are_installed_or_restored_leaves_none_behind(
    monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A review's SIGTERM just as SIGINT was taken left SIGINT deferred for the rest of the
    process (every later Ctrl-C swallowed); a Ctrl-C just as SIGINT was restored left SIGTERM
    and SIGHUP deferred, unrestored."""
    import os
    import signal

    from streamassign.pipeline.signals import deferred_signals, interrupt_on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    install = signal.signal

    sigint_calls: list[Any] = []  # the first takes SIGINT, the second restores it

    def signal_while_installing(signum: int, handler: Any) -> Any:
        previous = install(signum, handler)
        if signum == signal.SIGINT:
            sigint_calls.append(handler)
            if len(sigint_calls) == (1 if when == "install" else 2):
                os.kill(os.getpid(), signal.SIGTERM if when == "install" else signal.SIGINT)
        return previous

    with contextlib.suppress(KeyboardInterrupt), interrupt_on_signals():
        outer = {s: signal.getsignal(s) for s in before}
        monkeypatch.setattr(signal, "signal", signal_while_installing)
        try:
            with deferred_signals():
                pass
        finally:  # where the CLI's cleanup runs (a session stopped)
            monkeypatch.undo()
            assert {s: signal.getsignal(s) for s in before} == outer
    assert {s: signal.getsignal(s) for s in before} == before


def test_an_embedding_callers_own_sigterm_handler_still_runs() -> None:
    """A review's library caller, its own SIGTERM handler installed, got ``SystemExit(143)``
    from a CLI function and its handler never ran: SIGTERM and SIGHUP are taken only from
    their default. Its handler is back afterwards."""
    import os
    import signal

    from streamassign.pipeline.signals import interrupt_on_signals

    received: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        try:
            with interrupt_on_signals():
                os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:
            pytest.fail("the caller's SIGTERM handler was overridden")
        assert received == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
