"""click's test runner with stderr kept apart from stdout on every click the range allows."""

from __future__ import annotations

import inspect

from click.testing import CliRunner


def cli_runner() -> CliRunner:
    """A ``CliRunner`` whose results have ``stdout`` and ``stderr`` apart: click before 8.2
    mixes stderr into stdout unless told not to (``mix_stderr``, which 8.2 removed)."""
    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
        return CliRunner(mix_stderr=False)
    return CliRunner()
