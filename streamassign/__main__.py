"""``python -m streamassign``: the CLI (``streamassign`` without the console script)."""

from .cli import main

main()
