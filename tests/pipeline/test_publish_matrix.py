"""Publish under every fault at every file-system call, its line's advice then followed: the
earlier run is never lost, the new one is where the line says, and no hidden folder is left
unnamed. On a local disk (atomic renames) and an object store (a rename copies file by file,
deleting each source once copied, and can stop partway). A trimmed version of a fault matrix run
by hand: one fault per publish, plus the put-back stopped partway; no Spark."""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamassign.errors import PublishError
from streamassign.pipeline.runs import LocalFiles, publish
from streamassign.pipeline.signals import interrupt_on_signals

#: A fault at one call: its kind; for a rename stopped partway (``part``), the files it moved
#: first, how it ended (an error; two signals; a group signal that stops the JVM too), and
#: whether it copies the manifest last (a look then finds DIR without it).
Fault = tuple[Any, ...]
KINDS: tuple[Fault, ...] = (("err",), ("sig",), ("sig2",), ("sig_jvm",), ("sig_fail",))
SIGNALS_SENT = {"sig": 1, "sig_jvm": 1, "sig_fail": 1, "sig2": 2}


class _Store(LocalFiles):
    """The disk (``object_store``: renames copy file by file) with one fault per call number.
    After a group signal that stops the JVM, every call fails as py4j's does."""

    def __init__(self, object_store: bool, faults: dict[int, Fault]) -> None:
        self.object_store, self.faults = object_store, faults
        self.calls: list[str] = []
        self.stopped = False

    def _call(self, name: str, real: Callable[[], Any], *args: str) -> Any:
        self.calls.append(name)
        if self.stopped:
            raise ConnectionRefusedError(111, "Connection refused")
        fault = self.faults.get(len(self.calls), ("",))
        partial = fault[0] == "part"
        if partial:  # copied some, then ended as fault[2] says
            self._copy(args[0], args[1], files=fault[1], manifest_last=len(fault) > 3)
            fault = fault[2:3]
        if fault[0] == "err":
            raise OSError("503 SlowDown")
        if fault[0] == "sig_fail":  # the JVM stopped during the call: it never answers
            self._signal(fault[0])
            raise ConnectionRefusedError(111, "Connection refused")
        answer = None if partial else real()
        if fault[0] == "err_after":
            raise OSError("injected after its effect")
        self._signal(fault[0])
        return answer

    def _signal(self, kind: str) -> None:
        for _ in range(SIGNALS_SENT.get(kind, 0)):
            os.kill(os.getpid(), signal.SIGTERM)
        self.stopped = self.stopped or kind in ("sig_jvm", "sig_fail")

    def _copy(
        self, source: str, target: str, files: int = 10**6, manifest_last: bool = False
    ) -> None:
        """Copy then delete, file by file, ``files`` of them (all by default)."""
        src, dst = Path(source), Path(target)
        if not self._present(src):
            raise FileNotFoundError(source)
        paths = sorted((p for p in src.rglob("*") if p.is_file()), reverse=manifest_last)
        for path in paths[:files]:
            (dst / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst / path.relative_to(src))
            path.unlink()
        _prune(src)

    def _present(self, path: Path) -> bool:
        if not self.object_store:
            return os.path.lexists(path)
        return path.is_dir() and any(p.is_file() for p in path.rglob("*"))

    def exists(self, path: str) -> bool:
        return bool(self._call("exists", lambda: self._present(Path(path))))

    def read_text(self, path: str) -> str | None:
        text: str | None = self._call("read_text", lambda: LocalFiles.read_text(self, path))
        return text

    def delete(self, path: str) -> None:
        self._call("delete", lambda: LocalFiles.delete(self, path))

    def rename(self, source: str, target: str) -> None:
        def real() -> None:
            if self.object_store:
                self._copy(source, target)
            else:
                os.replace(source, target)

        self._call("rename", real, source, target)


def _prune(root: Path) -> None:
    """Object stores have no folders: none is left empty."""
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()


def _make_run(path: Path, run_id: str) -> None:
    (path / "manifest").mkdir(parents=True)
    (path / "manifest" / "part-00000.json").write_text(f'{{"run_id": "{run_id}", "rows": 2}}\n')
    for assignor in ("a", "b"):
        (path / f"rebalances/assignor={assignor}").mkdir(parents=True)
        (path / f"rebalances/assignor={assignor}/part-{run_id}.parquet").write_text(run_id)


def _files(path: Path) -> dict[str, str] | None:
    if not path.exists():
        return None
    return {str(p.relative_to(path)): p.read_text() for p in path.rglob("*") if p.is_file()}


def _publish(tmp_path: Path, object_store: bool, old: str | None, faults: dict[int, Fault]) -> Any:
    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    if old == "run":
        _make_run(final, "old")
    elif old == "empty":
        final.mkdir()
    _make_run(staging, "new")
    store = _Store(object_store, faults)
    try:
        with interrupt_on_signals():
            note = publish(store, str(staging), str(final), "new")
    except PublishError as exc:
        return exc.where, store
    except KeyboardInterrupt as exc:
        return exc.args[1], store
    return f"run new is in {final}" + (f"; {note}" if note else ""), store


def _follow(line: str, tmp_path: Path) -> None:
    """Do what the line says, literally."""
    final, aside = tmp_path / "run", tmp_path / ".run.replaced-new"
    f, a = re.escape(str(final)), re.escape(str(aside))
    if f"copy the files of {aside} into {final}, then delete {aside}" in line:
        if aside.exists():
            shutil.copytree(aside, final, dirs_exist_ok=True)
            shutil.rmtree(aside)
    elif re.search(
        rf"delete {f}( if it is there)? \(part of the new run\), then move {a} to", line
    ):
        shutil.rmtree(final, ignore_errors=True)
        os.replace(aside, final)
    elif re.search(
        rf"the earlier run is in {a}( \(putting it back failed: [^)]*\))?: move it", line
    ):
        assert not final.exists()
        os.replace(aside, final)
    elif f"{final} holds part of the new run: delete it" in line or (
        f"delete {final} if it is there (part of the new one)" in line
    ):
        shutil.rmtree(final, ignore_errors=True)
    for leftover in tmp_path.iterdir():  # "... left in X: delete it", "... (deleting it failed)"
        said = rf"left in {re.escape(str(leftover))}( \(deleting it failed: [^)]*\))?[:;] delete it"
        if leftover.name.startswith(".") and re.search(said, line):
            shutil.rmtree(leftover)


def _check(line: str, tmp_path: Path, old: dict[str, str] | None, new: dict[str, str]) -> None:
    final = tmp_path / "run"
    assert "in neither" not in line
    hidden = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert all(name in line for name in hidden), f"{hidden} unnamed in: {line}"
    if "look at both before deleting either" in line:
        return  # said: nothing to do blindly
    _follow(line, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], line
    if f"run new is in {final}" in line or "but it is there" in line:
        assert _files(final) == new, line
    elif old:
        assert _files(final) == old, line  # the earlier run, whole, in DIR
    else:
        assert not _files(final), line


def _cases() -> list[tuple[bool, str | None, int, Fault]]:
    cases: list[tuple[bool, str | None, int, Fault]] = []
    for object_store in (False, True):
        for old in ("run", "empty", None):
            if object_store and old == "empty":
                continue  # an object store holds no empty folder
            calls = ["read_text", "exists", "read_text", "rename", "rename", "delete"]
            for number, name in enumerate(calls if old else [*calls[:2], "rename"], start=1):
                kinds = (*KINDS, ("err_after",)) if name in ("rename", "delete") else KINDS
                cases += [(object_store, old, number, kind) for kind in kinds]
                if object_store and name == "rename":
                    cases += [(True, old, number, ("part", 1, end)) for end in ("err", "sig2")]
    return cases


@pytest.mark.parametrize(("object_store", "old", "call", "fault"), _cases())
def test_every_fault_at_every_call_loses_nothing_and_says_where_each_run_is(
    tmp_path: Path, object_store: bool, old: str | None, call: int, fault: Fault
) -> None:
    new = _files_of_run(tmp_path / "x", "new")
    before = _files_of_run(tmp_path / "y", "old") if old == "run" else ({} if old else None)
    line, _ = _publish(tmp_path, object_store, old, {call: fault})
    _check(line, tmp_path, before, new)


def _files_of_run(path: Path, run_id: str) -> dict[str, str]:
    _make_run(path, run_id)
    files = _files(path)
    shutil.rmtree(path)
    assert files is not None
    return files


@pytest.mark.parametrize("manifest_last", [False, True])
@pytest.mark.parametrize("copied", [0, 1, 2, 3])
@pytest.mark.parametrize("end", ["err", "sig2", "sig_fail"])
def test_a_put_back_stopped_partway_loses_nothing(
    tmp_path: Path, copied: int, end: str, manifest_last: bool
) -> None:
    """On an object store the new run's rename failed before copying, then the
    put-back (a copy of the whole old run) stopped partway: by an error, two signals, or a group
    signal that stopped the JVM too (``sig_fail``: nothing answers, the line goes by the steps;
    with all 3 files copied, only its answer was lost). The line said "delete DIR if it is there
    (part of the new run), then move ASIDE to DIR": DIR held the put-back's part of the OLD run,
    which following it deleted (and a look that found DIR without its manifest said the same).
    Whatever DIR holds once the put-back was called is the old run's (it runs only when DIR is
    absent): the line now says to copy the rest into it."""
    new = _files_of_run(tmp_path / "x", "new")
    old = _files_of_run(tmp_path / "y", "old")
    fault = ("part", copied, end) + (("manifest last",) if manifest_last else ())
    line, store = _publish(tmp_path, True, "run", {5: ("err",), 8: fault})
    assert store.calls[4:8] == ["rename", "exists", "exists", "rename"]  # the put-back's rename
    if end == "sig_fail":
        assert "perhaps split between them (putting it back stopped partway)" in line
    _check(line, tmp_path, old, new)


def test_an_empty_folder_put_back_is_kept(tmp_path: Path) -> None:
    """An empty DIR (simulate takes one without --overwrite) is moved aside like
    a run; the new run's rename failed, the empty folder was put back, and the line said the
    earlier run was "in neither DIR nor ASIDE"."""
    line, _ = _publish(tmp_path, False, "empty", {5: ("err",)})
    assert line == f"the earlier run in {tmp_path / 'run'} kept"
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_a_second_signal_during_the_put_back_ends_it_without_tidying(tmp_path: Path) -> None:
    """A signal that broke into the put-back after a failure was not counted
    as a second one: the look then deleted the new run's folder after the user asked to stop
    (and a hung store needed one more signal)."""
    line, store = _publish(tmp_path, False, "run", {5: ("err",), 6: ("sig2",)})
    final, aside, staging = (tmp_path / n for n in ("run", ".run.replaced-new", ".run.partial-new"))
    assert line == (
        f"the earlier run is in {aside}: move it to {final}; the new run is left in {staging}: "
        "delete it"
    )
    assert "delete" not in store.calls and staging.exists()


def test_a_jvm_gone_before_the_move_aside_leaves_dir_as_it_was(tmp_path: Path) -> None:
    """A group signal stopped the JVM while publish read the old run's manifest,
    before any move; the line said "moving it aside failed: look at both" about an aside folder
    never made."""
    line, store = _publish(tmp_path, True, "run", {3: ("sig_fail",)})
    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    assert line == (
        "could not look ([Errno 111] Connection refused); by the moves that ended: "
        f"{final} left as it was; the new run may be left in {staging}: delete it"
    )
    assert "rename" not in store.calls
