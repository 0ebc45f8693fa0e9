"""High availability in the runtime on a real broker: a third process joins a stateful app,
with the high-availability assignor and with the plain sticky assignor, side by side on the same
broker in the same run (runs interleaved), same data, same flow.

The scenario is ``tests/integration/ha_join.py`` (the broker test asserts on the same runs):
6 tasks summing per key in RocksDB, no standbys; ``preload`` records processed by two
processes, then records flow at ``rate``/s while the third process joins. Measured per run:
records the newcomer restored when it took its tasks over (and the changelog size of those
tasks at the join, about what a full restore reads), seconds from its start to the balanced
assignment (final tasks everywhere, no warmups), the longest gap between changelog writes of a
moved task from the join to the balance (its processing downtime) against the longest gap of
the steady flow before the join, and whether the final tables were exact.

Run ``python benchmarks/runtime_ha.py [--quick] [--markdown docs/ha.md] [--bootstrap H:P]``;
without ``--bootstrap`` a broker is started through ``scripts/kafka.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from _common import Report, arguments, chosen, console, machine_info, on_broker, publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from tests.integration.ha_join import JoinOutcome, create_topic, run_join  # noqa: E402

SECTION = "ha_broker"


@dataclasses.dataclass(frozen=True)
class Config:
    preload: int
    rate: int
    flow_seconds: float
    probing_ms: int
    acceptable_lag: int
    warmups: int
    repeats: int


FULL = Config(
    preload=600_000,
    rate=1000,
    flow_seconds=25,
    probing_ms=5000,
    acceptable_lag=10_000,
    warmups=2,
    repeats=2,
)
QUICK = dataclasses.replace(FULL, preload=120_000, rate=500, flow_seconds=16, repeats=1)


def measure(cfg: Config, bootstrap: str, tmp: Path) -> dict[bool, list[JoinOutcome]]:
    runs: dict[bool, list[JoinOutcome]] = {True: [], False: []}
    for i in range(cfg.repeats):
        for ha in (True, False):
            name = f"ha-bench-{'ha' if ha else 'sticky'}-{i}-{uuid.uuid4().hex[:8]}"
            asyncio.run(create_topic(bootstrap, f"{name}-in"))
            console.print(f"run {i + 1}/{cfg.repeats}: {'ha' if ha else 'sticky'}")
            out = run_join(
                bootstrap,
                f"{name}-in",
                name,
                tmp / name,
                ha=ha,
                preload=cfg.preload,
                rate=cfg.rate,
                flow_seconds=cfg.flow_seconds,
                probing_ms=cfg.probing_ms,
                acceptable_lag=cfg.acceptable_lag,
                warmups=cfg.warmups,
            )
            console.print(out)
            runs[ha].append(out)
    return runs


def report(cfg: Config, runs: dict[bool, list[JoinOutcome]]) -> Report:
    table = Report(
        f"A process joins: 6 stateful tasks, {cfg.preload:,} records before the join, "
        f"{cfg.rate:,} records/s during it",
        [
            "assignor",
            "records restored at takeover",
            "changelog of moved tasks at join",
            "moved task downtime",
            "steady longest gap",
            "join -> balanced",
            "newcomer rebalances",
            "warmups before actives",
            "tables exact",
        ],
        notes=(
            f"Median of {cfg.repeats} run(s) each, interleaved on one broker. HA: probing every "
            f"{cfg.probing_ms / 1000:g} s, acceptable lag {cfg.acceptable_lag:,}, "
            f"{cfg.warmups} warmups; no standbys. Downtime: longest gap between changelog "
            "writes of a moved task from the join to the balance (the steady gap is the same "
            "measure before the join). Changelogs without compaction here, so that the write "
            "timestamps survive and a full restore reads the whole changelog."
        ),
    )
    for ha, outs in runs.items():

        def med(values: Sequence[float]) -> float:
            return float(statistics.median(values))

        table.add(
            "ha" if ha else "sticky",
            f"{med([o.restored for o in outs]):,.0f}",
            f"{med([sum(o.changelog_at_join.values()) for o in outs]):,.0f}",
            f"{med([o.downtime for o in outs]):.2f} s",
            f"{med([o.steady_gap for o in outs]):.2f} s",
            f"{med([o.balanced_after for o in outs]):.1f} s",
            f"{med([o.rebalances for o in outs]):g}",
            "yes" if all(o.warmups_first == o.moved for o in outs) else "no",
            "yes" if all(o.exact for o in outs) else "NO",
        )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(
        __doc__, SECTION, quick="small sizes, one run each", repeats="runs of each assignor"
    )
    args = parser.parse_args(argv)
    cfg = chosen(args, QUICK, FULL)
    info = machine_info()
    with on_broker(args.bootstrap, info) as (bootstrap, tmp):
        runs = measure(cfg, bootstrap, tmp)
    heading = "## Measured on the broker: a process joins, HA vs sticky"
    publish([report(cfg, runs)], args, info, "benchmarks/runtime_ha.py", argv, heading)
    return 0


if __name__ == "__main__":
    sys.exit(main())
