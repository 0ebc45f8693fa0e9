"""Run directories: published whole, an old run kept until a new one is complete, and one-line
diagnoses of incomplete or empty runs (no Spark needed)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from streamassign.pipeline import PipelineError
from streamassign.pipeline.runs import (
    LocalFiles,
    check_rows_read,
    check_run,
    describe_existing,
    new_run_id,
    publish,
    replaceable,
    staging_path,
    write_manifest,
)

from .conftest import deny_reading, hadoop_checksums


def make_run(path: Path, run_id: str, rows: int = 3) -> None:
    part = path / "rebalances" / "assignor=task%3Asticky"
    part.mkdir(parents=True)
    if rows:
        (part / "part-00000.snappy.parquet").write_bytes(b"PAR1")
    write_manifest(LocalFiles(), str(path), {"run_id": run_id, "rows": rows})


def test_run_ids_sort_by_time_and_differ() -> None:
    first, second = new_run_id(), new_run_id()
    assert first != second and len(first) == len("20261126T121843Z-3f9a1c")


def test_manifest_is_written_whole_with_no_temporary_left(tmp_path: Path) -> None:
    write_manifest(LocalFiles(), str(tmp_path), {"run_id": "a", "rows": 1})
    write_manifest(LocalFiles(), str(tmp_path), {"run_id": "b", "rows": 2})
    assert [p.name for p in (tmp_path / "manifest").iterdir()] == ["part-00000.json"]
    assert json.loads((tmp_path / "manifest" / "part-00000.json").read_text())["run_id"] == "b"


def test_publish_replaces_an_old_run_only_with_a_complete_one(tmp_path: Path) -> None:
    final = tmp_path / "run"
    make_run(final, "old")
    said = describe_existing(LocalFiles(), str(final))
    assert said == f"{final} already holds a complete run (old)"
    staging = Path(staging_path(str(final), "new"))
    assert staging.parent == tmp_path and staging.name == ".run.partial-new"
    make_run(staging, "new")
    publish(LocalFiles(), str(staging), str(final), "new")
    assert check_run(LocalFiles(), str(final))["run_id"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing left aside


def test_a_failed_publish_puts_the_old_run_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    final = tmp_path / "run"
    make_run(final, "old")
    files = LocalFiles()
    real = files.rename
    calls = []

    def rename(source: str, target: str) -> None:
        calls.append(target)
        if len(calls) == 2:  # moving the new run into place fails
            raise OSError("disk gone")
        real(source, target)

    monkeypatch.setattr(files, "rename", rename)
    with pytest.raises(OSError):
        publish(files, str(tmp_path / ".run.partial-new"), str(final), "new")
    assert check_run(LocalFiles(), str(final))["run_id"] == "old"


@pytest.mark.parametrize("when", ["aside", "delete"])
def test_a_signal_while_publishing_waits_until_the_new_run_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A review's SIGTERM just after the old run was moved aside interrupted publish there:
    the caller's cleanup deleted the new run and the old one stayed aside, DIR gone. One
    during the old run's deletion left half of it behind; now it is not held (a slow remote
    delete would hold it): it ends the deletion with the new run in place, the old one at worst
    aside. (Under ``interrupt_on_signals``, as the CLI runs it.)"""
    import os
    import signal

    from streamassign.pipeline.signals import interrupt_on_signals

    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    make_run(final, "old")
    make_run(staging, "new")
    files = LocalFiles()
    rename, delete = files.rename, files.delete

    def rename_then_signal(source: str, target: str) -> None:
        rename(source, target)
        if when == "aside" and ".replaced-" in target:
            os.kill(os.getpid(), signal.SIGTERM)

    def signal_then_delete(path: str) -> None:
        if when == "delete" and ".replaced-" in path:
            os.kill(os.getpid(), signal.SIGTERM)
        delete(path)

    monkeypatch.setattr(files, "rename", rename_then_signal)
    monkeypatch.setattr(files, "delete", signal_then_delete)
    with pytest.raises(KeyboardInterrupt) as raised, interrupt_on_signals():
        publish(files, str(staging), str(final), "new")
    left = [] if when == "aside" else [".run.replaced-new"]  # the deletion was interrupted
    note = f"; the run it replaced is left in {tmp_path / '.run.replaced-new'}: delete it by hand"
    assert raised.value.args == (signal.SIGTERM, f"run new is in {final}" + note * bool(left))
    assert check_run(LocalFiles(), str(final))["run_id"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [*left, "run"]


def test_a_failed_move_aside_leaves_the_old_run_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a run moved aside, with nothing in its place, is put back."""
    final = tmp_path / "run"
    make_run(final, "old")
    make_run(tmp_path / ".run.partial-new", "new")
    files = LocalFiles()

    def rename(source: str, target: str) -> None:
        raise OSError("read-only")

    monkeypatch.setattr(files, "rename", rename)
    with pytest.raises(OSError):
        publish(files, str(tmp_path / ".run.partial-new"), str(final), "new")
    assert check_run(LocalFiles(), str(final))["run_id"] == "old"


@pytest.mark.parametrize(
    ("failing", "where"),
    [
        # Which renames fail (1: the old run aside, 2: the new one into place, 3: the old one
        # back), and where the error says the old run is; "partial": an object store's rename
        # copied part of the new run into place before failing.
        ({1}, "the earlier run in {final} kept"),
        ({2}, "the earlier run in {final} kept"),
        (
            {2, 3},
            "the earlier run is in {aside} (putting it back failed: read-only): move it to {final}",
        ),
        (
            {"partial"},
            "the earlier run is in {aside}: delete {final} (part of the new run), then move "
            "{aside} to {final}",
        ),
    ],
)
def test_a_failed_publish_deletes_the_new_run_and_says_where_the_old_one_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: set[object], where: str
) -> None:
    """An audit: a publish that failed with an error (not a signal) left the new run's hidden
    staging folder behind, for good; and the one line said the old run was kept where it was
    left aside. The old run is never deleted: it is in place, or aside and said so."""
    from streamassign.errors import PublishError

    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    aside = tmp_path / ".run.replaced-new"
    make_run(final, "old")
    make_run(staging, "new")
    files = LocalFiles()
    real = files.rename
    calls: list[str] = []

    def rename(source: str, target: str) -> None:
        calls.append(target)
        if "partial" in failing and len(calls) == 2:
            (Path(target) / "rebalances").mkdir(parents=True)  # a page copied, then a failure
            raise OSError("copy failed")
        if len(calls) in failing:
            raise OSError("disk gone" if len(calls) < 3 else "read-only")
        real(source, target)

    monkeypatch.setattr(files, "rename", rename)
    with pytest.raises(PublishError) as raised:
        publish(files, str(staging), str(final), "new")
    assert raised.value.where == where.format(final=final, aside=aside)
    assert str(raised.value.__cause__) in ("disk gone", "copy failed")  # the move's, not after
    assert not staging.exists()
    old = final if where.endswith("kept") else aside
    assert check_run(LocalFiles(), str(old))["run_id"] == "old"


def test_a_failed_first_publish_deletes_the_new_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamassign.errors import PublishError

    staging = tmp_path / ".run.partial-new"
    make_run(staging, "new")
    files = LocalFiles()

    def rename(source: str, target: str) -> None:
        raise OSError("read-only")

    monkeypatch.setattr(files, "rename", rename)
    with pytest.raises(PublishError, match="no earlier run was there"):
        publish(files, str(staging), str(tmp_path / "run"), "new")
    assert list(tmp_path.iterdir()) == []


def test_a_publish_that_cannot_look_says_the_folder_is_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote file system that fails at the first look: nothing was moved, and the line
    must not guess whether a run was there."""
    from streamassign.errors import PublishError

    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    make_run(final, "old")
    make_run(staging, "new")
    files = LocalFiles()

    def exists(path: str) -> bool:
        raise ConnectionError("the JVM is gone")

    monkeypatch.setattr(files, "exists", exists)
    with pytest.raises(PublishError) as raised:
        publish(files, str(staging), str(final), "new")
    assert raised.value.where == f"{final} left as it was"
    assert not staging.exists()
    assert check_run(LocalFiles(), str(final))["run_id"] == "old"


def test_an_old_run_that_cannot_be_deleted_is_a_note_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new run is in place when deleting the old one fails (a remote delete refused): the
    publish succeeded, and the old run is aside, not kept in DIR. A review saw such a failure
    end the command with "simulating failed: ...; the run in DIR kept"."""
    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    make_run(final, "old")
    make_run(staging, "new")
    files = LocalFiles()

    def delete(path: str) -> None:
        raise OSError("Permission denied")

    monkeypatch.setattr(files, "delete", delete)
    left = publish(files, str(staging), str(final), "new")
    aside = tmp_path / ".run.replaced-new"
    assert left == (
        f"the run it replaced is left in {aside} (deleting it failed: Permission denied); "
        "delete it by hand"
    )
    assert check_run(LocalFiles(), str(final))["run_id"] == "new"
    assert check_run(LocalFiles(), str(aside))["run_id"] == "old"


@pytest.mark.parametrize("marker_moved", [False, True])
def test_a_move_aside_that_failed_partway_never_calls_the_old_run_part_of_the_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marker_moved: bool
) -> None:
    """A review: on an object store the first rename (the old run aside) copied part of the
    old run, then failed; the line said "delete DIR (part of the new run), then move [aside]
    to DIR", which deletes the only complete copy. Now it says the old run is in both (the
    store may have deleted some copied files from DIR: ``marker_moved``, its manifest too)
    and how to make DIR whole without deleting anything of it."""
    from streamassign.errors import PublishError

    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    aside = tmp_path / ".run.replaced-new"
    make_run(final, "old")
    make_run(staging, "new")
    files = LocalFiles()
    real = files.rename

    def copies_a_page_then_fails(source: str, target: str) -> None:
        if target != str(aside):
            real(source, target)
            return
        shutil.copytree(final / "manifest", aside / "manifest")
        if marker_moved:  # a copy-then-delete page: its source deleted
            shutil.rmtree(final / "manifest")
        raise OSError("503 SlowDown")

    monkeypatch.setattr(files, "rename", copies_a_page_then_fails)
    with pytest.raises(PublishError) as raised:
        publish(files, str(staging), str(final), "new")
    assert raised.value.where == (
        f"the earlier run is in {final} and {aside}, perhaps split between them (a move failed "
        f"partway): copy the files of {aside} into {final}, then delete {aside}"
    )
    assert not staging.exists()
    shutil.copytree(aside, final, dirs_exist_ok=True)  # the advice, followed
    shutil.rmtree(aside)
    assert check_run(LocalFiles(), str(final))["run_id"] == "old"


@pytest.mark.parametrize("replacing", [True, False])
def test_a_rename_that_took_effect_but_raised_is_a_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replacing: bool
) -> None:
    """A review: an HDFS client that retries a rename whose answer was lost gets false, and
    ``HadoopFiles.rename`` raises; the new run was in DIR, complete, while the line said the
    publish failed ("delete DIR (part of the new run)", or "no earlier run was there")."""
    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    if replacing:
        make_run(final, "old")
    make_run(staging, "new")
    files = LocalFiles()
    real = files.rename

    def renames_then_raises(source: str, target: str) -> None:
        real(source, target)
        if source == str(staging):
            raise PipelineError(f"cannot rename {source} to {target}")

    monkeypatch.setattr(files, "rename", renames_then_raises)
    note = publish(files, str(staging), str(final), "new")
    assert note == (
        f"moving it into {final} said it failed (cannot rename {staging} to {final}), but it "
        "is there"
    )
    assert check_run(LocalFiles(), str(final))["run_id"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the old one deleted


def test_a_move_aside_that_took_effect_but_raised_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamassign.errors import PublishError

    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    make_run(final, "old")
    make_run(staging, "new")
    files = LocalFiles()
    real = files.rename
    calls: list[str] = []

    def renames_then_raises(source: str, target: str) -> None:
        calls.append(target)
        real(source, target)
        if len(calls) == 1:
            raise PipelineError("cannot rename")

    monkeypatch.setattr(files, "rename", renames_then_raises)
    with pytest.raises(PublishError) as raised:
        publish(files, str(staging), str(final), "new")
    assert raised.value.where == f"the earlier run in {final} kept"
    assert check_run(LocalFiles(), str(final))["run_id"] == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


class _JvmStoppedBySignal(LocalFiles):
    """Hadoop's file system in a JVM that a signal to the process group stops: SIGTERM right
    after the rename to ``at``, and every call after it fails as py4j's does."""

    def __init__(self, at: Path) -> None:
        self.at, self.stopped = str(at), False

    def _answering(self) -> None:
        if self.stopped:
            raise ConnectionRefusedError(111, "Connection refused")

    def exists(self, path: str) -> bool:
        self._answering()
        return super().exists(path)

    def read_text(self, path: str) -> str | None:
        self._answering()
        return super().read_text(path)

    def delete(self, path: str) -> None:
        self._answering()
        super().delete(path)

    def rename(self, source: str, target: str) -> None:
        import os
        import signal

        self._answering()
        super().rename(source, target)
        if target == self.at:
            os.kill(os.getpid(), signal.SIGTERM)  # deferred here; the JVM ends
            self.stopped = True


@pytest.mark.parametrize("after", ["aside", "move"])
def test_a_group_signal_that_stops_the_jvm_says_where_each_run_is(
    tmp_path: Path, after: str
) -> None:
    """A review: a SIGTERM or SIGHUP to the process group while a remote run was published
    stopped Spark's JVM too. Every later step failed, and the line said "the run in DIR kept"
    while DIR was empty (the old run aside, ``.partial-`` left: ``aside``), or held the new
    run (the note that the old run was left aside dropped: ``move``). Nothing can be looked
    at: the line says what the moves that ended tell, and that it could not look."""
    import signal

    from streamassign.pipeline.signals import interrupt_on_signals

    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    aside = tmp_path / ".run.replaced-new"
    make_run(final, "old")
    make_run(staging, "new")
    files = _JvmStoppedBySignal(aside if after == "aside" else final)
    with pytest.raises(KeyboardInterrupt) as raised, interrupt_on_signals():
        publish(files, str(staging), str(final), "new")
    said = {
        "aside": (
            f"the earlier run is in {aside}: delete {final} if it is there (part of the new "
            f"run), then move {aside} to {final}; the new run may be left in {staging}: "
            "delete it"
        ),
        "move": (
            f"run new is in {final}; the run it replaced may be left in {aside}: delete it by hand"
        ),
    }[after]
    assert raised.value.args == (
        signal.SIGTERM,
        f"could not look ([Errno 111] Connection refused); by the moves that ended: {said}",
    )
    assert check_run(LocalFiles(), str(aside))["run_id"] == "old"  # what it says is so
    if after == "move":
        assert check_run(LocalFiles(), str(final))["run_id"] == "new"
    else:
        assert not final.exists()


def test_a_signal_and_a_failure_say_where_each_run_is_by_looking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal, then a failure whose file system still answers (a local disk): the new run
    is deleted as after a failure, and the line says where the old one is by looking (its
    put-back failed too), not the caller's "kept"."""
    import os
    import signal

    from streamassign.pipeline.signals import interrupt_on_signals

    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    aside = tmp_path / ".run.replaced-new"
    make_run(final, "old")
    make_run(staging, "new")
    files = LocalFiles()
    real = files.rename

    def rename(source: str, target: str) -> None:
        if target != str(aside):
            raise OSError("disk gone")
        real(source, target)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(files, "rename", rename)
    with pytest.raises(KeyboardInterrupt) as raised, interrupt_on_signals():
        publish(files, str(staging), str(final), "new")
    assert raised.value.args == (
        signal.SIGTERM,
        f"the earlier run is in {aside} (putting it back failed: disk gone): move it to {final}",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.replaced-new"]


def test_a_second_signal_names_the_new_run_it_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: two signals (the second ends at once) after the old run was moved aside put
    it back and said so, but not that the new run's hidden folder was left behind."""
    import os
    import signal

    from streamassign.pipeline.signals import interrupt_on_signals

    final, staging = tmp_path / "run", tmp_path / ".run.partial-new"
    make_run(final, "old")
    make_run(staging, "new")
    files = LocalFiles()
    real = files.rename

    def rename(source: str, target: str) -> None:
        real(source, target)
        if ".replaced-" in target:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(files, "rename", rename)
    with pytest.raises(KeyboardInterrupt) as raised, interrupt_on_signals():
        publish(files, str(staging), str(final), "new")
    assert raised.value.args == (
        signal.SIGINT,
        f"the earlier run in {final} kept; the new run is left in {staging}: delete it",
    )
    assert check_run(LocalFiles(), str(final))["run_id"] == "old"
    assert check_run(LocalFiles(), str(staging))["run_id"] == "new"


def test_a_file_that_cannot_be_deleted_is_named_by_its_whole_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: ``rmtree`` named it relative to its folder (``'keep'``)."""
    import os

    folder = tmp_path / "old" / "manifest"
    folder.mkdir(parents=True)
    (folder / "keep").write_text("x")
    unlink = os.unlink

    def immutable(path: str, *args: object, **kwargs: object) -> None:
        if os.path.basename(path) == "keep":
            raise PermissionError(1, "Operation not permitted", path)
        unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", immutable)
    with pytest.raises(OSError) as raised:
        LocalFiles().delete(str(tmp_path / "old"))
    assert str(raised.value) == f"[Errno 1] Operation not permitted: '{folder / 'keep'}'"


class _HadoopPath:
    """A stand-in for Hadoop's ``Path`` on a file system whose ``delete`` returns false."""

    def __init__(self, path: str) -> None:
        self.path = path

    def getFileSystem(self, conf: object) -> object:
        return self

    def delete(self, path: _HadoopPath, recursive: bool) -> bool:
        return False

    def exists(self, path: _HadoopPath) -> bool:
        return True


def test_a_hadoop_delete_that_returns_false_raises() -> None:
    """Hadoop's ``FileSystem.delete`` may say it failed by returning false, not raising: the
    old run was then left aside while publish went on as if it were gone."""
    from types import SimpleNamespace

    from streamassign.pipeline.runs import HadoopFiles

    jvm = SimpleNamespace(
        org=SimpleNamespace(
            apache=SimpleNamespace(hadoop=SimpleNamespace(fs=SimpleNamespace(Path=_HadoopPath)))
        )
    )
    context = SimpleNamespace(_jvm=jvm, _jsc=SimpleNamespace(hadoopConfiguration=lambda: None))
    files = HadoopFiles(SimpleNamespace(sparkContext=context))
    with pytest.raises(PipelineError) as raised:
        files.delete("s3a://bucket/.run.replaced-x")
    assert str(raised.value) == "cannot delete s3a://bucket/.run.replaced-x"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "no such run directory"),
        (lambda p: p.mkdir(), "not a complete run (has no manifest and no rows"),
        (
            lambda p: (
                (p / "rebalances" / "x.parquet").parent.mkdir(parents=True)
                or (p / "rebalances" / "x.parquet").write_bytes(b"")
            ),
            "not a complete run (has rows but no manifest",
        ),
        (lambda p: make_run(p, "r", rows=0), "the run is empty (0 rebalances written)"),
        (
            lambda p: make_run(p, "r", rows=31000) or shutil.rmtree(p / "rebalances"),
            "damaged run: rebalances/ is missing, but the manifest says 31,000 rows were written",
        ),
        (
            # The review's case: the Parquet files deleted, the folders and manifest kept.
            lambda p: (
                make_run(p, "r", rows=31000)
                or [f.unlink() for f in (p / "rebalances").rglob("*.parquet")]
            ),
            "damaged run: rebalances/ holds no Parquet files, but the manifest says 31,000 rows "
            "were written",
        ),
        (
            lambda p: make_run(p, "r") or (p / "manifest" / "part-00000.json").write_text("{x"),
            "the manifest manifest/part-00000.json is unreadable (not one JSON object",
        ),
        # A manifest without a row count, or a count that is none, with the rows present.
        *(
            (
                lambda p, manifest=manifest: (
                    make_run(p, "r")
                    or (p / "manifest" / "part-00000.json").write_text(json.dumps(manifest))
                ),
                f"damaged manifest manifest/part-00000.json: {got}, not a count of the rows",
            )
            for manifest, got in (
                ({"run_id": "r"}, "no 'rows'"),
                ({"run_id": "r", "rows": -5}, "'rows' -5"),
                ({"run_id": "r", "rows": "31"}, "'rows' \"31\""),
                ({"run_id": "r", "rows": True}, "'rows' true"),
            )
        ),
        (
            # rebalances/ a link whose target is gone (an unmounted volume, say).
            lambda p: (
                make_run(p, "r", rows=31000)
                or shutil.rmtree(p / "rebalances")
                or (p / "rebalances").symlink_to(p.parent / "gone")
            ),
            "damaged run: rebalances/ is a symbolic link to ",
        ),
    ],
)
def test_check_run_says_what_is_wrong_in_one_line(
    tmp_path: Path, setup: object, message: str
) -> None:
    run = tmp_path / "run"
    setup(run)  # type: ignore[operator]
    with pytest.raises(PipelineError) as error:
        check_run(LocalFiles(), str(run))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_empty_folder_is_free_to_write(tmp_path: Path) -> None:
    assert describe_existing(LocalFiles(), str(tmp_path)) is None
    (tmp_path / "stray.txt").write_text("x")
    assert "is not a complete run" in (describe_existing(LocalFiles(), str(tmp_path)) or "")


def test_only_runs_and_empty_folders_are_replaceable(tmp_path: Path) -> None:
    marker = "manifest/part-00000.json"
    assert replaceable(LocalFiles(), str(tmp_path / "new"), marker)
    assert replaceable(LocalFiles(), str(tmp_path), marker)  # empty
    (tmp_path / "notes.txt").write_text("mine")
    assert not replaceable(LocalFiles(), str(tmp_path), marker)
    make_run(tmp_path / "run", "r")
    assert replaceable(LocalFiles(), str(tmp_path / "run"), marker)


class CountingFiles(LocalFiles):
    """Local files that count the reads."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def read_text(self, path: str) -> str | None:
        self.reads.append(path)
        return super().read_text(path)


@pytest.mark.parametrize("manifest", ["{x", None])
def test_check_run_reads_the_manifest_once(tmp_path: Path, manifest: str | None) -> None:
    run = tmp_path / "run"
    make_run(run, "r")
    if manifest is not None:
        (run / "manifest" / "part-00000.json").write_text(manifest)
    files = CountingFiles()
    if manifest is None:
        assert check_run(files, str(run))["run_id"] == "r"
    else:
        with pytest.raises(PipelineError, match="is unreadable"):
            check_run(files, str(run))
    assert files.reads == [f"{run}/manifest/part-00000.json"]


def test_an_empty_run_is_not_called_damaged(tmp_path: Path) -> None:
    """A run of 0 rows (Spark wrote no Parquet file) is empty, not damaged."""
    make_run(tmp_path / "run", "r", rows=0)
    with pytest.raises(PipelineError) as error:
        check_run(LocalFiles(), str(tmp_path / "run"))
    assert "the run is empty" in str(error.value) and "damaged" not in str(error.value)


def test_rows_read_must_be_the_rows_the_manifest_counts() -> None:
    """An audit found a run missing one assignor's files reported as if it had never been run:
    "Use faust:copartitioned", the best assignor absent, the page still saying 3,100 rows."""
    from streamassign.errors import DamagedRunError

    manifest = {"rows": 3100, "assignors": ["task:sticky", "faust:copartitioned"]}
    check_rows_read("run", manifest, 3100, {"task:sticky", "faust:copartitioned"})
    with pytest.raises(DamagedRunError) as missing:
        check_rows_read("run", manifest, 2480, {"faust:copartitioned"})
    assert str(missing.value) == (
        "run: damaged run: no rows of task:sticky under rebalances/ (2,480 of its 3,100 rows "
        "read; files deleted or moved?); run streamassign simulate again with --overwrite"
    )
    with pytest.raises(DamagedRunError, match="3,000 rows read under rebalances/, but the "):
        check_rows_read("run", manifest, 3000, {"task:sticky", "faust:copartitioned"})
    with pytest.raises(DamagedRunError, match="files added from elsewhere"):
        check_rows_read("run", manifest, 3200, {"task:sticky", "faust:copartitioned"})
    check_rows_read("run", {}, 5, {"x"})  # not a manifest simulate wrote: nothing to check


def test_a_damaged_run_is_described_as_damaged(tmp_path: Path) -> None:
    """A review's rerun on a run missing one assignor's folder said it "already holds a
    complete run"; report refused that run as damaged."""
    final = tmp_path / "run"
    make_run(final, "old")
    manifest = json.loads((final / "manifest" / "part-00000.json").read_text())
    both = {**manifest, "assignors": ["task:sticky", "consumer:range"]}
    write_manifest(LocalFiles(), str(final), both)
    assert describe_existing(LocalFiles(), str(final)) == (
        f"{final} holds a damaged run (old: no rows of consumer:range under rebalances/)"
    )
    shutil.rmtree(final / "rebalances")
    assert describe_existing(LocalFiles(), str(final)) == (
        f"{final} holds a damaged run (old: rebalances/ is missing, but the manifest says 3 rows "
        "were written (deleted or moved?))"
    )


def test_a_run_file_spark_cannot_read_is_a_damaged_run_naming_it() -> None:
    """Spark's read failure, as its message and trace put it, becomes the line a deleted file
    gets; any other failure is left alone."""
    from streamassign.errors import DamagedRunError
    from streamassign.pipeline.runs import unreadable_file

    uri = "file:///r/run/rebalances/assignor=task%253Asticky/part-0.snappy.parquet"
    failure = (
        f"[FAILED_READ_FILE.NO_HINT] Encountered error while reading file {uri}.  "
        "SQLSTATE: KD001\nCaused by: shaded.parquet.org.apache.thrift.protocol."
        "TProtocolException: Required field 'uncompressed_page_size' was not found"
    )
    damage = unreadable_file("/r/run", failure)
    assert isinstance(damage, DamagedRunError)
    assert str(damage) == (
        "/r/run: damaged run: rebalances/assignor=task%3Asticky/part-0.snappy.parquet cannot be "
        "read (it is not valid Parquet: its bytes changed since it was written); run streamassign "
        "simulate again with --overwrite"
    )
    checksum = failure + "\nCaused by: org.apache.hadoop.fs.ChecksumException: Checksum error"
    assert "(its checksum does not match:" in str(unreadable_file("/r/run", checksum))
    assert unreadable_file("/r/run", "java.io.IOException: No space left on device") is None
    denied = (
        f"[FAILED_READ_FILE.FILE_NOT_EXIST] Encountered error while reading file {uri}.  "
        f"Caused by: java.io.FileNotFoundException: {uri} (Permission denied)"
    )
    assert unreadable_file("/r/run", denied) is None  # intact bytes, not readable here
    timed_out = failure.split("\nCaused by:")[0] + "\nCaused by: java.net.SocketTimeoutException"
    assert unreadable_file("/r/run", timed_out) is None  # a remote store's read, not damage
    # A footer that cannot be read names the file by its path ('%' not escaped): as it is,
    # on a local disk or a remote store (nothing here to look the file up by).
    for run in ("/r/run", "hdfs://nn:8020/r/run"):
        part = f"{run}/rebalances/assignor=task%3Asticky/part-0.snappy.parquet"
        footer = failure.replace("NO_HINT", "CANNOT_READ_FILE_FOOTER").replace(uri, part)
        assert f"{run}: damaged run: rebalances/assignor=task%3Asticky/part-0" in str(
            unreadable_file(run, footer)
        ), run


def test_the_code_fingerprint_changes_with_any_shipped_file_and_nothing_else(
    tmp_path: Path,
) -> None:
    """A rerun keeps a run only if the code that wrote it is this code: its fingerprint covers
    every file the package ships (sources, the report's template) by path and bytes, whatever
    order they were written in, and no editor leftover or bytecode."""
    import streamassign
    from streamassign.pipeline.runs import code_fingerprint, sources_sha256

    package = tmp_path / "pkg"
    (package / "sub" / "__pycache__").mkdir(parents=True)
    (package / "sub" / "b.py").write_text("B = 1\n")
    (package / "a.py").write_text("A = 1\n")
    first = sources_sha256(package)
    assert first is not None and len(first) == 64
    (package / ".#a.py").symlink_to(package / "gone")  # an editor's lock: a dangling link
    for leftover in ("a.py~", "#a.py#", ".a.py.swp", "sub/b.pyc", "sub/__pycache__/b.pyc"):
        (package / leftover).write_bytes(b"not the package")
    assert sources_sha256(package) == first
    again = tmp_path / "again"  # the same files, written in the other order
    (again / "sub").mkdir(parents=True)
    (again / "a.py").write_text("A = 1\n")
    (again / "sub" / "b.py").write_text("B = 1\n")
    assert sources_sha256(again) == first
    (package / "a.py").write_text("A = 2\n")
    assert sources_sha256(package) != first
    (package / "a.py").write_text("A = 1\n")
    (package / "sub" / "b.py").rename(package / "sub" / "c.py")
    assert sources_sha256(package) != first
    (package / "sub" / "c.py").rename(package / "sub" / "b.py")
    (package / "report.html.j2").write_text("{{ page }}")  # shapes the report: counted
    assert sources_sha256(package) not in (first, None)
    assert code_fingerprint() == sources_sha256(Path(streamassign.__file__).resolve().parent)


def test_code_read_from_a_zip_has_its_folders_fingerprint_and_none_without_sources(
    tmp_path: Path,
) -> None:
    """Shipped as a zip (--ship-code, --py-files) the code is the same code; a package whose
    sources cannot be found has no fingerprint (the hash of nothing would match any other)."""
    import zipfile

    from streamassign.pipeline.runs import sources_sha256

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("A = 1\n")
    (package / "template.j2").write_text("page")
    with zipfile.ZipFile(tmp_path / "code.zip", "w") as zipped:
        for name in ("a.py", "template.j2"):
            zipped.write(package / name, f"pkg/{name}")
    assert sources_sha256(zipfile.Path(tmp_path / "code.zip", "pkg/")) == sources_sha256(package)
    (package / "a.py").unlink()
    assert sources_sha256(package) is None


def test_an_executor_running_other_code_than_the_driver_fails_in_one_line() -> None:
    """A task of a worker whose code is not the driver's writes no row, and its line names
    where each one's code is (the driver adds the cause: see the next test)."""
    from streamassign.errors import ExecutorCodeError
    from streamassign.pipeline.runs import OTHER_CODE_LINE, Code, check_executor_code, this_code

    check_executor_code(this_code())  # the same code: nothing to say
    check_executor_code(Code("/driver/streamassign", None))  # nothing the manifest could name
    ours = this_code()
    with pytest.raises(ExecutorCodeError) as failed:
        check_executor_code(Code("/elsewhere/streamassign", "f" * 64))
    assert str(failed.value) == (
        f"Spark's Python workers import other streamassign code ({ours.where}, "
        f"{(ours.fingerprint or '')[:12]}…) than this command (/elsewhere/streamassign, "
        "ffffffffffff…)"
    )
    said = OTHER_CODE_LINE.match(str(failed.value))
    assert said is not None and said["where"] == ours.where


def test_the_driver_names_one_cause_of_a_worker_running_other_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cause was worked out by the worker, which runs other code (often older, that blamed
    the working directory whatever the cause): the driver names it from the worker's package
    folder, its own folder and working directory, PYSPARK_PYTHON and whether it ships code."""
    from streamassign.pipeline.runs import Code, why_other_code

    driver = Code(str(tmp_path / "driver" / "streamassign"), "f" * 64)
    changed = "its files changed since the command started (an edit, a checkout); run it again"
    assert why_other_code(driver.where, driver, shipped=False, local_master=True) == changed
    shipped_zip = "/tmp/spark-1/userFiles-2/streamassign-pipeline-code-0a1b2c3d.zip/streamassign"
    assert why_other_code(shipped_zip, driver, shipped=True, local_master=True) == changed
    monkeypatch.chdir(tmp_path)
    assert why_other_code(
        str(tmp_path / "streamassign"), driver, shipped=False, local_master=True
    ) == (
        f"a streamassign package in the working directory ({os.path.realpath(tmp_path)}) "
        "comes first on the workers' path; run from a folder without one"
    )
    installed = "/usr/lib/python3/dist-packages/streamassign"
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert why_other_code(installed, driver, shipped=False, local_master=True) == (
        "PYSPARK_PYTHON (/usr/bin/python3) has a streamassign of its own; install this one there"
    )
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # what local mode sets by default
    assert why_other_code(installed, driver, shipped=False, local_master=True) == (
        "the executors' Python has a streamassign of its own; pass --ship-code"
    )
    assert why_other_code(installed, driver, shipped=True, local_master=True) == (
        "the executors' Python imports its own streamassign first; install this one there"
    )
    # A cluster's executors may hold another install at the driver's very path: not "changed".
    assert why_other_code(driver.where, driver, shipped=False, local_master=False) == (
        "the executors' Python has a streamassign of its own; pass --ship-code"
    )
    # A worker that could not tell its folder names the bare package: no cause from its path,
    # also where the command runs beside its own package, or from a deleted folder.
    os.makedirs(os.path.dirname(driver.where), exist_ok=True)
    monkeypatch.chdir(os.path.dirname(driver.where))
    bare = "the executors' Python has a streamassign of its own; pass --ship-code"
    assert why_other_code("streamassign", driver, shipped=False, local_master=True) == bare
    (tmp_path / "gone").mkdir()
    monkeypatch.chdir(tmp_path / "gone")
    (tmp_path / "gone").rmdir()  # the command's folder deleted while it ran: still one line
    assert why_other_code(installed, driver, shipped=True, local_master=True) == (
        "the executors' Python imports its own streamassign first; install this one there"
    )
    assert why_other_code("streamassign", driver, shipped=False, local_master=True) == bare


def test_a_local_master_is_one_whose_workers_run_on_this_machine() -> None:
    from streamassign.pipeline.runs import is_local_master

    for master in ("local", "local[4]", "local[*]", "local-cluster[2,1,1024]"):
        assert is_local_master(master), master
    for master in ("yarn", "k8s://https://k:443", "spark://localhost:7077", ""):
        assert not is_local_master(master), master


def test_checksum_damage_finds_changed_bytes_and_deleted_or_added_files(tmp_path: Path) -> None:
    """What run_damage cannot see (one file of an assignor's several gone, a flipped byte)
    shows against the checksum files Spark's local writer leaves beside each Parquet file."""
    from streamassign.pipeline.runs import checksum_damage, rows_added, rows_unchecked

    folder = tmp_path / "rebalances" / "assignor=task%3Asticky"
    folder.mkdir(parents=True)
    assert checksum_damage(str(tmp_path)) is None  # nothing to check by: not damage
    assert rows_unchecked(str(tmp_path), {}) == (
        "its manifest lists no files with their digests (a run written to a remote folder, or "
        "by older code) and no checksum file (.*.parquet.crc) is under rebalances/ (copied "
        "without its dot files, or written through a file system that writes none)"
    )
    for name, size in (("part-0.parquet", 1500), ("part-1.parquet", 700)):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        (folder / name).write_bytes(data)
        (folder / f".{name}.crc").write_bytes(hadoop_checksums(data))
    assert checksum_damage(str(tmp_path)) is None
    assert rows_unchecked(str(tmp_path), {}) is None
    first = folder / "part-0.parquet"
    flipped = bytearray(first.read_bytes())
    flipped[1000] ^= 1
    first.write_bytes(bytes(flipped))
    where = "rebalances/assignor=task%3Asticky/part-0.parquet"
    assert checksum_damage(str(tmp_path)) == f"{where} has bytes changed since it was written"
    first.write_bytes(bytes(flipped) + b"more" * 200)
    assert checksum_damage(str(tmp_path)) == f"{where} changed size since it was written"
    first.unlink()
    assert checksum_damage(str(tmp_path)) == f"{where} is missing (its checksum file remains)"
    (folder / ".part-0.parquet.crc").unlink()
    assert checksum_damage(str(tmp_path)) is None
    assert rows_added(str(tmp_path), {}) == []
    (folder / "part-9.parquet").write_bytes(b"PAR1")
    assert checksum_damage(str(tmp_path)) is None
    assert rows_added(str(tmp_path), {}) == ["rebalances/assignor=task%3Asticky/part-9.parquet"]


def test_rows_damage_checks_the_files_sizes_and_digests_the_manifest_lists(
    tmp_path: Path,
) -> None:
    """A Parquet file deleted together with its checksum file left nothing to check it by; a
    run without checksum files (``hdfs dfs -get``, a file system writing none) was called
    damaged, and then kept with a byte changed (same size). The manifest lists the files the
    run wrote with their sizes and SHA-256 digests: checked, with checksum files or without."""
    from streamassign.pipeline.runs import (
        ROW_FILES,
        ROW_SHA256,
        LocalFiles,
        row_digests,
        row_files,
        rows_added,
        rows_damage,
        rows_unchecked,
    )

    folder = tmp_path / "rebalances" / "assignor=task%3Asticky"
    folder.mkdir(parents=True)
    for name in ("part-0.parquet", "part-1.parquet"):
        (folder / name).write_bytes(b"PAR1")
        (folder / f".{name}.crc").write_bytes(hadoop_checksums(b"PAR1"))
    (tmp_path / "rebalances" / "_SUCCESS").write_bytes(b"")
    listed = row_files(LocalFiles(), str(tmp_path))
    assert listed == {
        "assignor=task%3Asticky/part-0.parquet": 4,
        "assignor=task%3Asticky/part-1.parquet": 4,
    }
    digest = hashlib.sha256(b"PAR1").hexdigest()
    assert row_digests(str(tmp_path)) == dict.fromkeys(listed, digest)
    manifest = {ROW_FILES: listed, ROW_SHA256: row_digests(str(tmp_path))}
    assert rows_damage(str(tmp_path), manifest) is None
    for sidecar in folder.glob(".*.crc"):  # copied without its dot files: the list still tells
        sidecar.unlink()
    assert rows_damage(str(tmp_path), manifest) is None
    assert rows_unchecked(str(tmp_path), manifest) is None
    assert rows_unchecked(str(tmp_path), {ROW_FILES: listed}) is not None  # sizes alone
    where = "rebalances/assignor=task%3Asticky/part-1.parquet"
    (folder / "part-1.parquet").write_bytes(b"PAR2")  # same size
    assert rows_damage(str(tmp_path), manifest) == f"{where} has bytes changed since it was written"
    (folder / "part-1.parquet").unlink()
    assert rows_damage(str(tmp_path), manifest) == f"{where} is missing (the manifest lists it)"
    (folder / "part-1.parquet").write_bytes(b"PAR1PAR1")
    assert rows_damage(str(tmp_path), manifest) == (
        f"{where} changed size since it was written (4 bytes then, 8 now)"
    )
    (folder / "part-1.parquet").write_bytes(b"PAR1")
    # Spark reads every file in a partition folder as rows, none beside them (a note).
    (tmp_path / "rebalances" / "notes.txt").write_text("mine")
    (folder / ".hidden").write_text("mine")
    assert rows_added(str(tmp_path), manifest) == []
    (folder / "part-1.parquet.orig").write_bytes(b"PAR1")
    assert rows_damage(str(tmp_path), manifest) is None
    assert rows_added(str(tmp_path), manifest) == [f"{where}.orig"]


def test_every_file_added_among_a_runs_rows_is_named_at_once(tmp_path: Path) -> None:
    """Only the first file added was named: a user moving them out needed a rerun for each."""
    from streamassign.pipeline.runs import ROW_FILES, LocalFiles, added_text, row_files, rows_added

    folders = [tmp_path / "rebalances" / f"assignor={name}" for name in ("a", "b")]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / "part-0.parquet").write_bytes(b"PAR1")
    manifest = {ROW_FILES: row_files(LocalFiles(), str(tmp_path))}
    (folders[1] / "copy.parquet").write_bytes(b"PAR1")
    (folders[0] / "part-0.parquet.orig").write_bytes(b"PAR1")
    (folders[0] / "notes.txt").write_text("mine")
    added = rows_added(str(tmp_path), manifest)
    assert added == [
        "rebalances/assignor=a/notes.txt",
        "rebalances/assignor=a/part-0.parquet.orig",
        "rebalances/assignor=b/copy.parquet",
    ]
    assert added_text(added) == (
        "rebalances/assignor=a/notes.txt, rebalances/assignor=a/part-0.parquet.orig, "
        "rebalances/assignor=b/copy.parquet are not files the run wrote (added from elsewhere?)"
    )
    assert added_text(added[2:]) == (
        "rebalances/assignor=b/copy.parquet is not a file the run wrote (added from elsewhere?)"
    )


def test_a_run_file_that_cannot_be_read_is_said_in_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row file the check could not open (a permission, a disk error) was a traceback: it
    is the line naming it and why, by its digest or by its checksum file alike."""
    from streamassign.pipeline.runs import (
        ROW_FILES,
        ROW_SHA256,
        LocalFiles,
        row_digests,
        row_files,
        rows_damage,
    )

    folder = tmp_path / "rebalances" / "assignor=task%3Asticky"
    folder.mkdir(parents=True)
    locked = folder / "part-0.parquet"
    locked.write_bytes(b"PAR1")
    (folder / ".part-0.parquet.crc").write_bytes(hadoop_checksums(b"PAR1"))
    listed = {ROW_FILES: row_files(LocalFiles(), str(tmp_path))}
    digested = listed | {ROW_SHA256: row_digests(str(tmp_path))}
    deny_reading(monkeypatch, locked)
    for manifest in (digested, listed, {}):  # by digest, by checksum file
        assert rows_damage(str(tmp_path), manifest) == (
            "rebalances/assignor=task%3Asticky/part-0.parquet cannot be read (Permission denied)"
        ), manifest
