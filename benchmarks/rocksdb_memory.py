"""RSS of one process writing to N runtime RocksDB stores, as the runtime writes them (one
batch per commit of 100 records), for docs/runtime.md "RocksDB memory". Run it against any
checkout (``PYTHONPATH=<checkout>``): one without ``RocksDBMemory`` opens its stores with
RocksDB's defaults, as the runtime did before the per-process budget.

    python benchmarks/rocksdb_memory.py --stores 20 --writes 400000 [--budget-mib 128]
    [--keys 1000] [--value-bytes 100]

``--busy``: one busy store among N (the case where writes stalled on flushes): each round writes
every other store 20 x 100 B and then the busy one 1,000 x 1 KiB, in one thread as the event
loop writes them; says the busy store's write latencies and the "Stopping writes" lines in the
stores' ``LOG``s (RocksDB stopped a write until a flush finished).

    python benchmarks/rocksdb_memory.py --busy --stores 200 [--rounds 300] [--budget-mib 128]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import streamassign.runtime.stores as stores_module

BATCH = 100
SAMPLES = 8


def proc_field(path: str, name: str) -> int:
    """A number from a ``/proc/self`` file (``VmRSS`` in KiB, ``write_bytes`` in bytes)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    return -1


def rss_mb() -> int:
    return proc_field("/proc/self/status", "VmRSS:") >> 10


def open_stores(root: Path, count: int, memory: Any) -> list[Any]:
    extra = {} if memory is None else {"memory": memory}
    return [
        stores_module.open_store("rocksdb", root / f"s{n}.rocksdb", **extra) for n in range(count)
    ]


def memtables_mb(memory: Any) -> str:
    """What the budget's memtables hold now (the write buffer manager's count)."""
    return "" if memory is None else f"memtables {memory.write_buffers.get_usage() >> 20} MB; "


def write_evenly(args: argparse.Namespace, root: Path, memory: Any) -> str:
    """Every store written alike: RSS sampled ``SAMPLES`` times, SST files, disk writes."""
    stores = open_stores(root, args.stores, memory)
    started, samples = time.monotonic(), [rss_mb()]
    steps = args.writes // BATCH
    padding = b"v" * args.value_bytes
    for step in range(1, steps + 1):
        first = step * BATCH
        for n, store in enumerate(stores):
            writes = {
                b"k%09d" % ((first + i) % args.keys): b"%d,%d%s" % (first + i, n, padding)
                for i in range(BATCH)
            }
            store.write(writes, {"position": b"%d" % step})
        if step % max(1, steps // SAMPLES) == 0:
            samples.append(rss_mb())
    held = memtables_mb(memory)
    for store in stores:
        store.close()
    seconds = time.monotonic() - started
    sst_files = sum(1 for _ in root.rglob("*.sst"))
    written_mb = proc_field("/proc/self/io", "write_bytes:") >> 20
    return (
        f"{args.stores} stores x {args.writes} writes, {args.keys} keys: RSS MB {samples}, "
        f"peak {max(samples)}, after close {rss_mb()}; {held}{sst_files} SST files; "
        f"{written_mb} MB written to disk; {seconds:.0f} s"
    )


def write_one_busy(args: argparse.Namespace, root: Path, memory: Any) -> str:
    """One busy store among ``args.stores``: its write latencies and the stores' stops."""
    stores = open_stores(root, args.stores, memory)
    busy, latencies, started = stores[0], [], time.monotonic()
    for round_ in range(args.rounds):
        for store in stores[1:]:
            store.write({b"%08d" % (round_ * 20 + i): b"c" * 100 for i in range(20)}, {})
        before = time.perf_counter()
        busy.write({b"%09d" % (round_ * 1000 + i): b"h" * 1000 for i in range(1000)}, {})
        latencies.append(time.perf_counter() - before)
    seconds = time.monotonic() - started
    for store in stores:
        store.close()
    stops = sum(
        log.read_text(errors="replace").count("Stopping writes") for log in root.rglob("LOG")
    )
    latencies.sort()
    p99, slowest = latencies[int(len(latencies) * 0.99)], latencies[-1]
    return (
        f"{args.stores} stores, one busy, {args.rounds} rounds: {seconds:.1f} s; busy store's "
        f"write p99 {p99 * 1e3:.0f} ms, max {slowest * 1e3:.0f} ms, "
        f"{sum(s > 0.1 for s in latencies)} over 100 ms; {stops} 'Stopping writes' LOG lines"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=1)
    parser.add_argument("--writes", type=int, default=2_000_000, help="per store")
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys per store")
    parser.add_argument("--value-bytes", type=int, default=0, help="added to each ~10 B value")
    parser.add_argument("--busy", action="store_true", help="one busy store among --stores")
    parser.add_argument("--rounds", type=int, default=300, help="with --busy")
    parser.add_argument("--budget-mib", type=int, default=None)
    args = parser.parse_args()
    memory: Any = None
    if hasattr(stores_module, "RocksDBMemory"):
        budget = args.budget_mib or stores_module.DEFAULT_ROCKSDB_MEMORY_MIB
        memory = stores_module.RocksDBMemory.of(budget)
    root = Path(tempfile.mkdtemp(prefix="rocksdb-memory-"))
    try:
        said = (write_one_busy if args.busy else write_evenly)(args, root, memory)
    finally:
        shutil.rmtree(root)
    bound = "RocksDB defaults" if memory is None else f"budget {memory.total_bytes >> 20} MiB"
    print(f"{bound}: {said}")


if __name__ == "__main__":
    main()
