"""Fixtures of the pipeline tests: small workloads, and one local Spark session for them all.

The session is local[2] (two executor threads, as on the development machine), started once per
test session: a JVM start costs 10-15 s, a small job a few seconds. Tests that need Spark skip
when pyspark is not installed (the spark extra).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamassign.pipeline import ScenarioModel, Workload

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "topology"
ORDERS = TOPOLOGIES / "orders-join.toml"
CLICKSTREAM = TOPOLOGIES / "clickstream-repartition.toml"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from streamassign.pipeline.spark import start_session

    session = start_session("local[2]", "streamassign-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def orders() -> Workload:
    return Workload.from_file(ORDERS)


@pytest.fixture(scope="session")
def clickstream() -> Workload:
    return Workload.from_file(CLICKSTREAM)


#: A busy model: every event type happens within a dozen steps.
BUSY = ScenarioModel(
    steps=16,
    min_initial_clients=2,
    max_initial_clients=5,
    min_clients=1,
    max_clients=7,
    scale_out_per_hour=1.0,
    scale_in_per_hour=1.0,
    crash_per_client_hour=0.3,
    rolling_restart_per_hour=0.3,
    expansion_per_hour=0.5,
    rack_loss_per_hour=0.3,
)


def hadoop_checksums(data: bytes, chunk: int = 512) -> bytes:
    """The ``.NAME.crc`` file Hadoop's local file system writes beside a file of ``data``."""
    sums = b"".join(
        zlib.crc32(data[i : i + chunk]).to_bytes(4, "big") for i in range(0, len(data), chunk)
    )
    return b"crc\0" + chunk.to_bytes(4, "big") + sums


def deny_reading(monkeypatch: pytest.MonkeyPatch, locked: Path) -> None:
    """``locked`` cannot be opened, as a file without read permission (tests run as root, who
    reads any file)."""
    opened = Path.open

    def denied(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)


def deny_listing(monkeypatch: pytest.MonkeyPatch, locked: Path) -> None:
    """The folder ``locked`` cannot be listed, as one without read permission (tests run as
    root, who lists any folder): ``Path.rglob`` skips it without a word, ``os.walk`` tells
    its ``onerror``. A folder given by a file descriptor (``shutil.rmtree``) is listed."""
    scandir = os.scandir

    def denied(path: Any = ".") -> Any:
        if isinstance(path, str | os.PathLike) and Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", denied)


def deny_searching(monkeypatch: pytest.MonkeyPatch, locked: Path) -> None:
    """The folder ``locked`` can be listed but not searched, as one with read permission and
    no execute permission (mode 644): its entries' names and kinds are known, looking at one
    (``stat``) is refused."""
    scandir = os.scandir

    class Unsearchable:
        def __init__(self, entry: os.DirEntry[str]) -> None:
            self.entry = entry

        def __getattr__(self, name: str) -> Any:
            return getattr(self.entry, name)

        def __fspath__(self) -> str:
            return self.entry.path

        def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
            raise PermissionError(13, "Permission denied", self.entry.path)

    class Listing:
        def __init__(self, listing: Any) -> None:
            self.listing = listing

        def __enter__(self) -> Listing:
            return self

        def __exit__(self, *exc: object) -> None:
            self.listing.close()

        def __iter__(self) -> Listing:
            return self

        def __next__(self) -> Unsearchable:
            return Unsearchable(next(self.listing))

        def close(self) -> None:
            self.listing.close()

    def listed_only(path: Any = ".") -> Any:
        if isinstance(path, str | os.PathLike) and Path(path) == locked:
            return Listing(scandir(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", listed_only)
