"""click's test runner with stderr kept apart from stdout on every click the range allows."""

from __future__ import annotations

import inspect
import sys

import pytest
from click.testing import CliRunner


def cli_runner() -> CliRunner:
    """A ``CliRunner`` whose results have ``stdout`` and ``stderr`` apart: click before 8.2
    mixes stderr into stdout unless told not to (``mix_stderr``, which 8.2 removed)."""
    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
        return CliRunner(mix_stderr=False)
    return CliRunner()


def replace_in_cli(monkeypatch: pytest.MonkeyPatch, name: str, value: object) -> None:
    """Replace ``name`` in every module of ``streamassign.cli`` that holds it: each module
    imports the helpers it calls by name, so one shared by several commands (``_session``,
    ``_render``) is looked up in each of them."""
    import streamassign.cli  # noqa: F401  (every command's module, loaded)

    for module_name, module in sorted(sys.modules.items()):
        if module_name.startswith("streamassign.cli.") and hasattr(module, name):
            monkeypatch.setattr(module, name, value)
