"""The console script's entry point: Ctrl-C while the CLI loads ends with status 130."""

from __future__ import annotations

import importlib.abc
import sys
import tomllib
from pathlib import Path

import pytest

import _streamassign_console


class _Interrupting(importlib.abc.MetaPathFinder):
    """Ctrl-C arriving while ``streamassign.cli`` loads."""

    def find_spec(self, name: str, *_: object) -> None:
        if name == "streamassign.cli":
            raise KeyboardInterrupt
        return None


def test_ctrl_c_while_the_cli_loads_exits_130_without_a_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The console script imported ``streamassign.cli`` before any of our code ran, so an
    interrupt then was a KeyboardInterrupt trace; the entry point now imports it itself."""
    monkeypatch.delitem(sys.modules, "streamassign.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Interrupting(), *sys.meta_path])
    with pytest.raises(SystemExit) as ended:
        _streamassign_console.main()
    assert ended.value.code == 130


def test_the_console_script_is_the_module_that_loads_nothing_of_streamassign() -> None:
    """Importing the entry point's module must not import the package: that import is what
    an interrupt cut with a trace."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["streamassign"] == "_streamassign_console:main"
    source = Path(_streamassign_console.__file__).read_text()
    body = source.split("def main", 1)[0]
    assert "import streamassign" not in body and "from streamassign" not in body
