"""RSS of one process writing to N runtime RocksDB stores, as the runtime writes them (one
batch per commit of 100 records), for docs/runtime.md "RocksDB memory". Run it against any
checkout (``PYTHONPATH=<checkout>``): one without ``RocksDBMemory`` opens its stores with
RocksDB's defaults, as the runtime did before the per-process budget.

    python benchmarks/rocksdb_memory.py --stores 20 --writes 400000 [--budget-mib 128]
    [--keys 1000]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=1)
    parser.add_argument("--writes", type=int, default=2_000_000, help="per store")
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys per store")
    parser.add_argument("--budget-mib", type=int, default=None)
    args = parser.parse_args()
    memory: Any = None
    if hasattr(stores_module, "RocksDBMemory"):
        budget = args.budget_mib or stores_module.DEFAULT_ROCKSDB_MEMORY_MIB
        memory = stores_module.RocksDBMemory.of(budget)
    root = Path(tempfile.mkdtemp(prefix="rocksdb-memory-"))
    extra = {} if memory is None else {"memory": memory}
    stores = [
        stores_module.open_store("rocksdb", root / f"s{n}.rocksdb", **extra)
        for n in range(args.stores)
    ]
    started, samples = time.monotonic(), [rss_mb()]
    steps = args.writes // BATCH
    for step in range(1, steps + 1):
        first = step * BATCH
        for n, store in enumerate(stores):
            writes = {
                b"k%09d" % ((first + i) % args.keys): b"%d,%d" % (first + i, n)
                for i in range(BATCH)
            }
            store.write(writes, {"position": b"%d" % step})
        if step % max(1, steps // SAMPLES) == 0:
            samples.append(rss_mb())
    for store in stores:
        store.close()
    seconds = time.monotonic() - started
    sst_files = sum(1 for _ in root.rglob("*.sst"))
    written_mb = proc_field("/proc/self/io", "write_bytes:") >> 20
    shutil.rmtree(root)
    bound = "RocksDB defaults" if memory is None else f"budget {memory.total_bytes >> 20} MiB"
    print(
        f"{args.stores} stores x {args.writes} writes, {args.keys} keys, {bound}: RSS MB "
        f"{samples}, peak {max(samples)}, after close {rss_mb()}; {sst_files} SST files; "
        f"{written_mb} MB written to disk; {seconds:.0f} s"
    )


if __name__ == "__main__":
    main()
