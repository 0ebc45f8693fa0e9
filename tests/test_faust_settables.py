"""The worker's warning about set tables stored in RocksDB (Faust loses their members at every
restart; with ``value_type`` they come back empty): real Faust app objects, no broker. Which
tables are named must follow the store Faust really gives each table, ``memory://`` (ignored
by Faust) included (docs/faust.md, "Set tables")."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.stores.rocksdb import Store as RocksDBStore

from streamassign.faust._settables import set_tables_on_disk, warn_about_set_tables

from .test_faust_assignor import CL, SET_CL, SRC, make_app, rebalance

LOGGER = "streamassign.faust"


def set_table_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == level and r.getMessage().startswith("set table")
    ]


def warned(app: faust.App, caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[str]]:
    """The WARNING and ERROR lines ``warn_about_set_tables`` logs of ``app``."""
    with caplog.at_level(logging.WARNING, LOGGER):
        warn_about_set_tables(app)
    return set_table_lines(caplog, logging.WARNING), set_table_lines(caplog, logging.ERROR)


def test_a_rocksdb_set_table_is_named_in_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(tmp_path, 7000, store="rocksdb://")
    app.SetTable("members", start_manager=False)
    app.SetGlobalTable("regions", start_manager=False)
    [line], errors = warned(app, caplog)
    assert "set tables members, regions are stored in RocksDB" in line
    assert "loses members at every restart" in line
    assert "store='memory:///'" in line
    assert "retention" in line
    assert "totals" not in line and "rates" not in line  # plain tables lose nothing
    assert errors == []


def test_a_set_table_in_memory_and_plain_rocksdb_tables_are_not_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(tmp_path, 7000, store="rocksdb://")  # its Table and GlobalTable: RocksDB
    app.SetTable("members", store="memory:///", start_manager=False)
    assert warned(app, caplog) == ([], [])


def test_an_app_in_memory_names_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(tmp_path, 7000)  # memory://, Faust's default
    app.SetTable("members", value_type=int, start_manager=False)
    assert warned(app, caplog) == ([], [])


def test_memory_with_two_slashes_is_named_as_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``store="memory://"`` is a false yarl URL: Faust gives the table the app's RocksDB."""
    app = make_app(tmp_path, 7000, store="rocksdb://")
    app.SetTable("members", store="memory://", start_manager=False)
    [line], _ = warned(app, caplog)
    assert "members (its store='memory://' is ignored: write 'memory:///')" in line


@pytest.mark.parametrize("app_store", ["memory://", "rocksdb://"])
@pytest.mark.parametrize("table_store", [None, "memory://", "memory:///", "rocksdb://"])
def test_named_exactly_when_faust_stores_the_set_table_in_rocksdb(
    tmp_path: Path, app_store: str, table_store: str | None
) -> None:
    """The verdict is the store Faust itself makes (``rocksdb://``, false as well, gives a
    memory app's set table memory)."""
    app = make_app(tmp_path, 7000, store=app_store)
    options: dict[str, Any] = {} if table_store is None else {"store": table_store}
    table = app.SetTable("members", start_manager=False, **options)
    named = [t.name for t in set_tables_on_disk(app.tables.values(), app.conf.store)]
    assert named == (["members"] if isinstance(table.data.storage, RocksDBStore) else [])


def test_value_type_adds_one_error_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(tmp_path, 7000, store="rocksdb://")
    app.SetTable("members", value_type=int, start_manager=False)
    app.SetTable("tags", start_manager=False)
    [warning], [error] = warned(app, caplog)
    assert "members, tags" in warning
    assert "set table members (value_type=int) in RocksDB" in error
    assert "comes back EMPTY at every restart" in error
    assert "#261" in error
    assert "Drop value_type" in error
    assert "tags" not in error
    # Read, not made: the check must not create a store Faust would open later.
    assert all(table._data is None for table in app.tables.values())


def test_a_store_faust_cannot_resolve_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It runs in the join: whatever it cannot read must not stop the worker."""
    app = make_app(tmp_path, 7000)
    app.SetTable("members", store="nosuchstore://x", start_manager=False)
    with caplog.at_level(logging.WARNING, LOGGER):
        warn_about_set_tables(app)
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert "cannot check this app's set tables" in caplog.records[0].getMessage()


def test_a_worker_says_it_once_per_process_at_its_first_join(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At the first join every table is declared (the worker has started); each later join
    (every rebalance) would repeat it, so only the first says it."""
    app = make_app(tmp_path, 7000, store="rocksdb://")
    app.SetTable("members", value_type=int, start_manager=False)
    with caplog.at_level(logging.WARNING, LOGGER):
        assignor = app.assignor
        assert set_table_lines(caplog, logging.WARNING) == []  # not when the assignor is made
        for _ in range(3):
            rebalance({"m0": assignor}, counts={SRC: 6, CL: 6, SET_CL: 6})
    assert len(set_table_lines(caplog, logging.WARNING)) == 1
    assert len(set_table_lines(caplog, logging.ERROR)) == 1


def test_a_windowed_set_table_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(tmp_path, 7000, store="rocksdb://")
    app.SetTable("visits", start_manager=False).tumbling(60.0)
    [line], _ = warned(app, caplog)
    assert "set table visits is stored in RocksDB" in line
    assert "a windowed set table has none: use a Table whose value is the whole set" in line
