"""The runtime examples' own input checks, before any broker is contacted: bad counts and a
missing extra end in one line, never a trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_example(
    module: str, *args: str, hide: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository root; ``hide``: a module made unimportable,
    as if its extra were not installed."""
    code = "import runpy, sys\n"
    if hide:
        code += f"sys.modules[{hide!r}] = None\n"
    code += f"sys.argv = [{module!r}, *{list(args)!r}]\n"
    code += f"runpy.run_module({module!r}, run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("module", "option", "value", "message"),
    [
        ("examples.orders_join", "--customers", "0", "argument --customers: 0 is below 1"),
        ("examples.orders_join", "--orders", "-5", "argument --orders: -5 is below 1"),
        ("examples.orders_join", "--orders", "many", "argument --orders: 'many' is not a whole"),
        ("examples.word_count", "--sentences", "0", "argument --sentences: 0 is below 1"),
    ],
)
def test_a_bad_count_is_one_line(module: str, option: str, value: str, message: str) -> None:
    done = run_example(module, "--bootstrap", "127.0.0.1:1", option, value)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("module", ["examples.orders_join", "examples.word_count"])
def test_without_the_runtime_extra_the_example_names_it(module: str) -> None:
    done = run_example(module, "--bootstrap", "127.0.0.1:1", hide="aiokafka")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: aiokafka is not installed: pip install 'streamassign[runtime]'"
    )
