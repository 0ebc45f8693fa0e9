"""A command whose optional dependency is missing says which extra to install."""

from __future__ import annotations

import click


def _require(module: str, what: str, extra: str = "spark") -> None:
    """One line naming the extra to install when ``module`` is missing, not an ImportError's
    trace from deep inside the command."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise click.ClickException(
            f"{what} needs {module}, from the {extra} extra: pip install 'streamassign[{extra}]'"
        )
