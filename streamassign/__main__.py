"""``python -m streamassign``: the CLI (``streamassign`` without the console script)."""

try:
    from .cli import main
except KeyboardInterrupt:
    # Ctrl-C while the CLI loads: the shell's status for an interrupt, not a trace.
    raise SystemExit(130) from None

main()
