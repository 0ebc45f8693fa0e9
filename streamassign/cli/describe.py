"""``streamassign describe``: who runs what in a live group, once or with ``--watch``.

The Kafka-facing part is streamassign.aiokafka.describe (imported inside the command: aiokafka
is an extra); this module only parses options and renders."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import click

from .. import TaskId
from ..compare import (
    match_views,
)
from ..explain import (
    ClientView,
    Explanation,
    explain,
)
from ..streams import (
    ACCEPTABLE_RECOVERY_LAG,
    FAUST_PROTOCOL_NAME,
    handed_back,
)
from .connection import _check_security, _connection
from .console import _ReaderGone, _say, _say_wrapped, _Stdout
from .describe_tables import (
    _print_group,
    _print_rebalancing,
    _view_labels,
    members_gone,
    rebalancing_members,
)
from .extras import _require
from .group import main
from .options import _EXISTING_FILE, _acceptable_lag_option, _json_option, _shown
from .views import _moves_json, _print_moves, _too_few_for_standbys

#: How often ``describe --watch`` asks whether stdout's reader is gone (one ``poll`` call).
_READER_CHECK_S = 0.25


async def _watch(
    connection: Any,
    group: str,
    interval: float,
    standbys: int | None,
    as_json: bool,
    acceptable_lag: int = ACCEPTABLE_RECOVERY_LAG,
    clock: WatchClock | None = None,
) -> None:
    """Print each new view until interrupted or until stdout's reader is gone (``| grep -q
    Stable``, ``| head``): a one-shot command goes on as if read (``_ReaderGone``), but an
    endless poll that nobody reads would run headless for ever."""
    import asyncio

    stdout = sys.stdout
    printing = asyncio.ensure_future(
        _print_views(connection, group, interval, standbys, as_json, acceptable_lag, clock)
    )
    try:
        while not printing.done():
            if isinstance(stdout, _ReaderGone) and stdout.reader_gone():
                return
            await asyncio.wait([printing], timeout=_READER_CHECK_S)
        printing.result()  # its error, if it ended with one
    finally:
        printing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await printing


async def _print_views(
    connection: Any,
    group: str,
    interval: float,
    standbys: int | None,
    as_json: bool,
    acceptable_lag: int = ACCEPTABLE_RECOVERY_LAG,
    clock: WatchClock | None = None,
) -> None:
    from ..aiokafka.describe import follow, quality, to_json

    console = _Stdout()
    last = None  # the last readable view
    last_warning: str | None = None
    clock = clock or WatchClock()
    outage = _Outage(clock)
    async for view in follow(connection, group, interval, clock=clock.monotonic):
        if not as_json:
            back = outage.ended(view)
            if back is not None:
                console.print(f"{_now(clock.wall)} {group}: {back}", markup=False)
        if not view.readable:
            if as_json:
                click.echo(json.dumps(_between_json(view, last)))
            elif view.error is not None:
                line = (
                    f"{_now(clock.wall)} {group}: unavailable: {view.error}; "
                    "asking again until it answers"
                )
                console.print(line, markup=False)
            else:
                _print_rebalancing(console, view, last, f"{_now(clock.wall)} ", watching=True)
            continue
        score = quality(view, standbys)
        warning = _standby_cap_warning(score)
        if warning != last_warning and warning is not None:
            click.echo(warning, err=True)  # once, not at every change of the group
        last_warning = warning
        matched = match_views(last, view)
        # Each renumbering (views between that renumber nothing have none); a switch's, wrapped.
        (_say_wrapped if matched.switched else _say)(matched.note)
        moves = _moves_since(matched.before, view, acceptable_lag)
        # One naming for both views' processes: a moves row names the ones that left too.
        labels = _view_labels(view, matched.before or ())
        last, names = view, matched.names
        if as_json:
            data = to_json(view, score) | ({} if moves is None else _moves_json(moves, names))
            click.echo(json.dumps(data))
            continue
        console.rule(f"{group} at {_now(clock.wall)}")
        _print_group(console, view, score, labels)
        if moves is not None:
            faust = view.protocol == FAUST_PROTOCOL_NAME
            _print_moves(console, moves, labels=labels, uncertain_hand_backs=not faust, names=names)


def _between_json(view: Any, last: Any) -> dict[str, Any]:
    """``--json``'s object for a group between assignments (``view``, not readable): its
    state and each member as the last Stable view (``last``; None: none, as in one
    ``describe``) knew it, as the table watch prints them; a failed poll: its state and the
    reason apart."""
    if view.error is not None:
        return {"group": view.group, "state": view.state, "error": view.error}
    return {
        "group": view.group,
        "state": view.state,
        "protocol_type": view.protocol_type,
        "members": rebalancing_members(view, last),
        "members_gone": members_gone(view, last),
    }


@attrs.frozen
class WatchClock:
    """``describe --watch``'s clocks: ``monotonic`` measures an outage (a step of the wall
    clock during one cannot skew it), ``wall`` only dates it. Given, so a test sets both."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


class _Outage:
    """When ``describe --watch``'s group last answered before it became unavailable, to say
    once, when it answers again, how long it went unanswered: from its last answer, not from
    the poll that failed (which noticed the outage up to an interval and a timeout late)."""

    def __init__(self, clock: WatchClock) -> None:
        self.clock = clock
        self.since: float | None = None  # on clock.monotonic, as follow's answered_at

    def ended(self, view: Any) -> str | None:
        """The line to print before ``view`` (a ``GroupView``; its ``error`` set: its poll
        failed) when it ends an outage; None otherwise."""
        if view.error is not None:
            if self.since is None:
                answered = view.answered_at
                self.since = answered if answered is not None else self.clock.monotonic()
            return None
        if self.since is None:
            return None
        away, self.since = self.clock.monotonic() - self.since, None
        last = _clock(self.clock.wall() - away)
        return f"available again, {away:.0f} s after its last answer (at {last})"


def _moves_since(
    before: Mapping[str, ClientView] | None, view: Any, acceptable_lag: int
) -> Explanation | None:
    """What moved from ``before`` (the last view's processes as ``view``, a ``GroupView``,
    names them: ``compare.match_views``; None: ``view`` is the first) to ``view``."""
    if before is None:
        return None
    returned = _returned(view, acceptable_lag)
    return explain(before, view.processes(), view.local_state(), returned=returned)


def _returned(view: Any, acceptable_lag: int) -> dict[TaskId, str]:
    """``explain``'s ``returned`` for a described group (a ``GroupView``): the tasks its leader
    handed back to a restarted process at the last rebalance, by the leader's own rule."""
    reports = [(pid, m.offset_sums) for pid, ms in view.members_by_process().items() for m in ms]
    return handed_back(reports, view.previous_active(), view.protocol, acceptable_lag)


def _now(wall: Callable[[], float] = time.time) -> str:
    return _clock(wall())


def _clock(seconds: float) -> str:
    """``seconds`` (``time.time()``) as the watch's lines start: ``HH:MM:SS UTC``."""
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%H:%M:%S UTC")


@main.command()
@click.argument("group")
@click.option("--bootstrap", "-b", required=True, metavar="HOST:PORT[,...]", help="Kafka brokers.")
@click.option(
    "--security-protocol",
    type=click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
    default="PLAINTEXT",
    show_default=True,
)
@click.option(
    "--sasl-mechanism",
    type=click.Choice(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
    default="PLAIN",
    show_default=True,
)
@click.option(
    "--sasl-username", envvar="STREAMASSIGN_SASL_USERNAME", help="Or $STREAMASSIGN_SASL_USERNAME."
)
@click.option(
    "--sasl-password", envvar="STREAMASSIGN_SASL_PASSWORD", help="Or $STREAMASSIGN_SASL_PASSWORD."
)
@click.option("--ssl-cafile", type=_EXISTING_FILE, help="CA certificates (PEM).")
@click.option("--ssl-certfile", type=_EXISTING_FILE, help="Client certificate (PEM).")
@click.option("--ssl-keyfile", type=_EXISTING_FILE, help="Client private key (PEM).")
@click.option(
    "--standbys",
    type=click.IntRange(min=0),
    default=None,
    help="num_standby_replicas to score against (default: the most any task has).",
)
@_shown("--timeout", kind=click.FloatRange(min=0.1), default=10.0, help="Seconds per broker call.")
@click.option(
    "--watch", is_flag=True, help="Follow rebalances: print each new assignment and what moved."
)
@_shown(
    "--interval",
    kind=click.FloatRange(min=0.1),
    default=1.0,
    help="Seconds between polls (--watch).",
)
@_acceptable_lag_option(
    "--watch: acceptable_recovery_lag of the group's leader (ProcessHost's; the Faust "
    "assignor's is the default), to tell a hand-back to a restarted process from a move."
)
@_json_option("tables (with --watch: one JSON object per line)")
def describe(
    group: str,
    bootstrap: str,
    standbys: int | None,
    timeout: float,
    watch: bool,
    interval: float,
    acceptable_lag: int,
    as_json: bool,
    **security: Any,
) -> None:
    """Who runs what in live GROUP: processes, members, tasks, offset sums and quality.

    Decodes the streams protocol (ProcessHost, the Faust assignor), Faust's own assignor and
    the consumer assignors. The tables name processes and members by unique prefixes (a
    member by its tail), as git names commits; --json has the full ids, and its "assignment"
    table is a saved assignment for `streamassign explain` / `diff`.
    """
    with _interrupt_ends_with_130():
        import asyncio

        _require("aiokafka", "streamassign describe", "aiokafka")
        from ..aiokafka.describe import fetch_group, quality, to_json
        from ..errors import GroupDescribeError

        # aiokafka logs connection failures through logging's last-resort handler; the one-line
        # error below says it all.
        aiokafka_log = logging.getLogger("aiokafka")
        if not aiokafka_log.handlers:
            aiokafka_log.addHandler(logging.NullHandler())
        options = {k: v if not isinstance(v, Path) else str(v) for k, v in security.items()}
        _check_security(options)
        connection = _connection(bootstrap, timeout, options)
        try:
            if watch:
                asyncio.run(_watch(connection, group, interval, standbys, as_json, acceptable_lag))
                return
            view = asyncio.run(fetch_group(connection, group))
        except GroupDescribeError as exc:
            raise click.ClickException(str(exc)) from exc
        score = quality(view, standbys)
        warning = _standby_cap_warning(score)
        if warning is not None:
            click.echo(warning, err=True)
        if as_json:
            # Between assignments, the watch's keys (null: no Stable view before it).
            data = to_json(view, score) if view.readable else _between_json(view, None)
            click.echo(json.dumps(data, indent=2))
        else:
            _print_group(_Stdout(), view, score)


@contextlib.contextmanager
def _interrupt_ends_with_130() -> Iterator[None]:
    """Ctrl-C is how a watch ends: quietly, but with the shell's status for it (130), so a
    script can tell an interrupt from an end of its own (a reader gone: 0). Around every step
    of ``describe`` (aiokafka's import, connecting, printing): click turns an interrupt it
    sees into "Aborted!" with status 1."""
    try:
        yield
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def _standby_cap_warning(score: Any) -> str | None:
    """``plan``'s warning line (``_too_few_for_standbys``) for a described group (a
    ``GroupQuality``) too small for its ``--standbys``; None when it fits, or when the count
    was inferred (no --standbys to name)."""
    if score.standbys_inferred:
        return None
    too_few = _too_few_for_standbys(
        score.num_standby_replicas,
        score.metrics.clients,
        len(score.stateful),
        ("process", "processes"),
    )
    return None if too_few is None else f"warning: {too_few}"
