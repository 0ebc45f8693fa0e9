"""A kept run's refusals say what ``--overwrite`` would delete beside the run (files added among
its rows, the user's notes in its folders), never call an unreadable file damage, and never
advise deleting a run of other code that this code cannot write again."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from .conftest import deny_listing, deny_reading, deny_searching, hadoop_checksums
from .test_cli import _a_kept_run, _a_run_of, _damage, _list_rows, _printed_next, invoke

OTHER_CODE = {"code_sha256": "abc123" * 10 + "abcd"}


def _plan_passes_by(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spoil: Any) -> None:
    """plan-standbys' next command, over a run of its very simulation in its folder that
    ``spoil`` (given the folder) then changes, writes to the next folder, ``-2``, without
    ``--overwrite``."""
    monkeypatch.chdir(tmp_path)
    given = ["--scenarios", "3", "--steps", "5"]
    words, _ = _printed_next(monkeypatch, given)
    out = words[words.index("--out") + 1]
    _a_run_of(words, tmp_path / out)
    spoil(tmp_path / out)
    printed, _ = _printed_next(monkeypatch, given)
    assert "--overwrite" not in printed
    assert printed[printed.index("--out") + 1] == f"{out}-2"


def test_a_row_file_that_cannot_be_read_is_not_called_damage(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A row file without read permission was "damaged run: ... cannot be read", and
    plan-standbys printed --overwrite over the run: its bytes are not known to be changed, and
    a chmod keeps it. simulate and report say it cannot be read and how to keep the run;
    plan-standbys passes the run by."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    _list_rows(run)
    locked = next((run / "rebalances").glob("*/part-00000.parquet"))
    shown = f"rebalances/{locked.parent.name}/part-00000.parquet"
    deny_reading(monkeypatch, locked)
    assert invoke(*command) == (
        1,
        f"Error: {run}: its rows cannot be checked: {shown} cannot be read (Permission denied); "
        "make it readable (chmod) to keep the run, or pass --overwrite to simulate it again\n",
    )
    assert invoke("report", str(run)) == (
        1,
        f"Error: {run}: its rows cannot be checked: {shown} cannot be read (Permission denied); "
        "make it readable (chmod) and run streamassign report again\n",
    )
    _plan_passes_by(
        monkeypatch,
        tmp_path,
        lambda run: deny_reading(monkeypatch, next(run.glob("rebalances/*/part-00000.parquet"))),
    )


PARTITION = "rebalances/assignor=task%3Asticky"


@pytest.mark.parametrize("deny", [deny_listing, deny_searching])
@pytest.mark.parametrize("locked", ["rebalances", PARTITION])
def test_a_rows_folder_that_cannot_be_read_is_not_called_damage(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, locked: str, deny: Any
) -> None:
    """A folder of the rows without read permission listed as empty: simulate called the run
    damaged ("no rows of task:sticky", "holds no Parquet files") and advised --overwrite;
    report called its files missing. One listed but not searched (mode 644) raised a
    traceback. Both say it cannot be read and how to keep the run, and --overwrite's tail
    names the folder as one whose content is not known; a run of another simulation is
    refused as such (not called complete); plan-standbys passes the run by."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    _list_rows(run)
    deny(monkeypatch, run / locked)
    unreadable = f"its rows cannot be checked: {locked}/ cannot be read (Permission denied)"
    tail = f"(deleting {locked}/ (cannot be read) with the run: move it out of the run's folder "
    assert invoke(*command) == (
        1,
        f"Error: {run}: {unreadable}; make it readable (chmod) to keep the run, or pass "
        f"--overwrite to simulate it again {tail}first to keep it)\n",
    )
    assert invoke("report", str(run)) == (
        1,
        f"Error: {run}: {unreadable}; make it readable (chmod) and run streamassign report again\n",
    )
    code, out = invoke(*command, "--seed", "7")
    assert (code, out) == (
        1,
        f"Error: {run} already holds a run (first; its rows cannot be checked) of another "
        f"simulation (other --seed) without a report (streamassign report {run} writes it); "
        f"pass --overwrite to replace it once the new run is complete {tail}first to keep it), "
        "or --out for another folder\n",
    )
    monkeypatch.undo()
    _plan_passes_by(monkeypatch, tmp_path, lambda run: deny(monkeypatch, run / locked))


def test_the_users_files_beside_a_rows_folder_that_cannot_be_read_are_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a partition folder unreadable, --overwrite's tail named nothing in rebalances/,
    though --overwrite deletes the user's notes there: they are named, and so is the folder
    (what it holds is not known), for this simulation and for another."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    _list_rows(run)
    (run / "rebalances" / "NOTES.md").write_text("mine")
    deny_listing(monkeypatch, run / PARTITION)
    deleting = (
        f"(deleting rebalances/NOTES.md, {PARTITION}/ (cannot be read) with the run: move "
        "them out of the run's folder first to keep them)"
    )
    code, out = invoke(*command)
    assert (code, out.endswith(f"simulate it again {deleting}\n")) == (1, True), out
    code, out = invoke(*command, "--seed", "7")
    assert (code, f"complete {deleting}, or --out" in out) == (1, True), out


def test_a_file_added_beside_a_rows_folder_that_cannot_be_read_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A file added among the rows of a partition that can be read, beside one that cannot,
    went unnamed (nothing was looked at): it is named as added, which --overwrite deletes."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    _list_rows(run)
    extra = "rebalances/assignor=consumer%3Arange/extra.parquet"
    (run / extra).write_bytes(b"PAR1")
    deny_listing(monkeypatch, run / PARTITION)
    assert invoke(*command) == (
        1,
        f"Error: {run}: its rows cannot be checked: {PARTITION}/ cannot be read (Permission "
        f"denied), and {extra} is not a file the run wrote (added from elsewhere?); make it "
        "readable (chmod) to keep the run, or pass --overwrite to simulate it again (deleting "
        f"that file and {PARTITION}/ (cannot be read) with the run: move them out of the run's "
        "folder first to keep them)\n",
    )
    code, out = invoke(*command, "--seed", "7")
    assert (code, f"and {extra} is not a file the run wrote" in out) == (1, True), out


def test_a_folder_of_the_users_in_the_rows_that_cannot_be_read_is_said_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A folder of the user's in rebalances/ that cannot be read was said as the run's rows
    that cannot be checked: it is said as what it is (Spark would read its files)."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    _list_rows(run)
    (run / "rebalances" / "old").mkdir()
    deny_listing(monkeypatch, run / "rebalances" / "old")
    assert invoke(*command) == (
        1,
        f"Error: {run}: rebalances/old/ cannot be read (Permission denied), a folder the run "
        "did not write (Spark would read its files as rows); make it readable (chmod) to keep "
        "the run, or pass --overwrite to simulate it again (deleting rebalances/old/ (cannot be "
        "read) with the run: move it out of the run's folder first to keep it)\n",
    )


def test_what_makes_a_rows_folder_readable_is_said_by_its_error(tmp_path: Path) -> None:
    """Every error reading a folder of the rows got "make it readable (chmod)": chmod fixes a
    permission only, and one a folder of another user's only by its owner."""
    from streamassign.pipeline import runs

    def fix(number: int, owner: int) -> str:
        folder = tmp_path / f"f{number}-{owner}"
        folder.mkdir()
        os.chown(folder, owner, -1)
        return runs._fix_for(OSError(number, os.strerror(number)), folder)

    me = os.geteuid()
    assert fix(errno.EACCES, me) == fix(errno.EPERM, me) == "make it readable (chmod)"
    assert fix(errno.EACCES, me + 1) == "make it readable (chmod, by its owner)"
    assert fix(errno.ELOOP, me) == "fix the loop of symbolic links"
    assert fix(errno.EIO, me) == fix(errno.ESTALE, me) == "make it readable"


def test_a_checksum_file_that_cannot_be_read_is_named_not_its_parquet_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An unreadable checksum file was said as "rebalances/.../part-0.parquet cannot be read":
    the Parquet file, readable, is not what a chmod must fix."""
    from streamassign.pipeline.runs import rows_damage

    folder = tmp_path / "rebalances" / "assignor=task%3Asticky"
    folder.mkdir(parents=True)
    (folder / "part-0.parquet").write_bytes(b"PAR1")
    (folder / ".part-0.parquet.crc").write_bytes(hadoop_checksums(b"PAR1"))
    deny_reading(monkeypatch, folder / ".part-0.parquet.crc")
    assert rows_damage(str(tmp_path), {}) == (
        "the checksum file rebalances/assignor=task%3Asticky/.part-0.parquet.crc cannot be read "
        "(Permission denied)"
    )


def test_a_report_open_in_libreoffice_is_said_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """LibreOffice's lock file beside a report's CSV file (the file is open there) was named as
    a file of the user's to move out. The refusal says which file is open and to close it
    (the lock file stays, as does the report); beside a note, both are said."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    folder = _an_earlier_report(run)
    lock = folder / ".~lock.summary_by_event.csv#"
    lock.write_text("LibreOffice lock")
    assert invoke("report", str(run)) == (
        1,
        f"Error: {folder}: summary_by_event.csv is open in LibreOffice (its lock file "
        ".~lock.summary_by_event.csv# is there): not replacing the folder (a report replaces it "
        "whole); close summary_by_event.csv in LibreOffice first (if LibreOffice is not "
        "running, delete its lock file), or give another --out\n",
    )
    (folder / "my-analysis.md").write_text("mine")
    (folder / "report.html").unlink()
    assert invoke(*command) == (
        1,
        f"Error: {folder} holds my-analysis.md, which a report does not write: not replacing "
        "the folder (a report replaces it whole); close summary_by_event.csv in LibreOffice and "
        f"move my-analysis.md out of {folder} first to keep it, or write the report elsewhere: "
        f"streamassign report {run} --out OTHER\n",
    )
    assert lock.read_text() == "LibreOffice lock"


def test_a_refusal_names_the_files_added_among_the_rows_of_any_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run of other code with a file added among its rows was refused with "pass
    --overwrite to replace it" alone: following that deleted the file unsaid. It is named, and
    so is what --overwrite deletes, as for a run of this code."""
    from streamassign.pipeline.runs import code_fingerprint

    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run, **OTHER_CODE)
    rows = next((run / "rebalances").glob("*/part-00000.parquet"))
    (rows.parent / "part-00000.parquet.orig").write_bytes(rows.read_bytes())
    shown = f"rebalances/{rows.parent.name}/part-00000.parquet.orig"
    ours = (code_fingerprint() or "")[:12]
    assert invoke(*command) == (
        1,
        f"Error: {run} already holds a complete run (first) written by other code (fingerprint "
        f"abc123abc123…, this code's {ours}…) without a report (streamassign report {run} "
        f"writes it), and {shown} is not a file the run wrote (added from elsewhere?); pass "
        "--overwrite to replace it once the new run is complete (deleting that file with the "
        "run: move it out of the run's folder first to keep it), or --out for another folder\n",
    )


def test_the_users_files_in_a_runs_folders_are_named_before_overwrite_deletes_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Notes a user kept in a run's report/ or rebalances/ were deleted unsaid by the
    --overwrite a refusal advised, or plan-standbys printed: only the run's folder itself was
    looked at. The refusals name them; plan-standbys passes such a run by; a run it keeps
    keeps them."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    command.remove("--report")  # report/ holds no report: --report would be refused
    (run / "report").mkdir()
    (run / "report" / "my-analysis.md").write_text("mine")
    (run / "rebalances" / "notes.txt").write_text("mine")
    assert invoke(*command)[0] == 0
    _damage(run)
    shown = next((run / "rebalances").glob("*/part-00000.parquet")).relative_to(run)
    assert invoke(*command) == (
        1,
        f"Error: {run}: damaged run: {shown} has bytes changed since it was written; it cannot "
        "be kept: pass --overwrite to simulate it again (deleting rebalances/notes.txt, "
        "report/my-analysis.md with the run: move them out of the run's folder first to keep "
        "them)\n",
    )
    shutil.move(run / "rebalances", tmp_path / "rows")
    code, out = invoke("report", str(run))
    assert code == 1 and out.endswith(
        "(deleted or moved?); run streamassign simulate again with --overwrite (deleting "
        "report/my-analysis.md with the run: move it out of the run's folder first to keep it)\n"
    ), out
    shutil.move(tmp_path / "rows", run / "rebalances")
    (run / "rebalances" / "notes.txt").unlink()
    code, out = invoke(*command, "--seed", "7")
    assert (code, out) == (
        1,
        f"Error: {run} already holds a complete run (first) of another simulation (other "
        f"--seed) without a report (streamassign report {run} --out OTHER writes it); pass "
        "--overwrite to replace it once the new run is complete (deleting report/my-analysis.md "
        "with the run: move it out of the run's folder first to keep it), or --out for another "
        "folder\n",
    )

    def damaged_beside_notes(run: Path) -> None:
        _damage(run)
        (run / "report").mkdir()
        (run / "report" / "my-analysis.md").write_text("mine")

    (tmp_path / "plan").mkdir()
    _plan_passes_by(monkeypatch, tmp_path / "plan", damaged_beside_notes)


def test_report_on_a_damaged_run_of_other_code_advises_nothing_that_deletes_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """report on a damaged run of other code ended "run streamassign simulate again with
    --overwrite": this code's --overwrite deletes that code's run and report, which it cannot
    write again. The remedy says to simulate with that code, or with this code elsewhere."""
    run = tmp_path / "run"
    _a_kept_run(monkeypatch, run, **OTHER_CODE)
    _list_rows(run)
    _damage(run)
    shown = next((run / "rebalances").glob("*/part-00000.parquet")).relative_to(run)
    other = (
        "simulate it again with the code that wrote it (other code), or with this code and "
        "another --out (this code's --overwrite would delete that code's run)\n"
    )
    assert invoke("report", str(run)) == (
        1,
        f"Error: {run}: damaged run: {shown} has bytes changed since it was written; {other}",
    )
    for rows in (run / "rebalances").rglob("*.parquet"):
        rows.unlink()
    code, out = invoke("report", str(run))
    assert code == 1 and out.startswith(f"Error: {run}: damaged run: rebalances/ holds no "), out
    assert out.endswith(f"(deleted or moved?); {other}"), out


def _an_earlier_report(run: Path) -> Path:
    """A report in ``run/report`` as ``report`` leaves one (its page, its id), the folder."""
    from streamassign.cli import REPORT_ID

    folder = run / "report"
    folder.mkdir()
    (folder / "report.html").write_text("the earlier report")
    (folder / REPORT_ID).write_text("20261129T133447Z-4aa676\n")
    return folder


def test_a_report_is_never_written_over_the_users_files_in_its_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A report replaces its folder whole: report, and simulate --report writing a kept run's
    missing report, deleted a note the user kept beside the earlier report without a word
    (exit 0), and the kept line's "--overwrite simulates it again" named nothing it deletes.
    Both commands refuse before Spark starts, naming the note, which stays; the kept line
    names what --overwrite would delete."""
    run = tmp_path / "run"
    command = _a_kept_run(monkeypatch, run)
    folder = _an_earlier_report(run)
    (folder / "my-analysis.md").write_text("mine")
    refused = (
        f"Error: {folder} holds my-analysis.md, which a report does not write: not replacing "
        f"the folder (a report replaces it whole); move it out of {folder} first to keep it, "
    )
    assert invoke("report", str(run)) == (1, f"{refused}or give another --out\n")
    code, out = invoke(*command)
    assert code == 0, out
    assert (
        "kept, nothing simulated (--overwrite simulates it again, deleting "
        "report/my-analysis.md with the run)\n"
    ) in out
    (folder / "report.html").unlink()
    assert invoke(*command) == (
        1,
        f"{refused}or write the report elsewhere: streamassign report {run} --out OTHER\n",
    )
    assert (folder / "my-analysis.md").read_text() == "mine"


def test_report_on_a_run_of_other_code_says_no_deleting_where_its_remedy_deletes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """report on a run of other code with a file added among its rows, or damaged beside the
    user's note, glued "(deleting ... with the run ...)" after a remedy that deletes nothing,
    and told an intact run to be simulated again. An intact run needs the file moved out; a
    damaged one is simulated again elsewhere, nothing said deleted."""
    run = tmp_path / "run"
    _a_kept_run(monkeypatch, run, **OTHER_CODE)
    _list_rows(run)
    rows = next((run / "rebalances").glob("*/part-00000.parquet"))
    (rows.parent / "part-00000.parquet.orig").write_bytes(rows.read_bytes())
    (run / "rebalances" / "notes.txt").write_text("mine")
    shown = rows.relative_to(run)
    added = f"{shown}.orig is not a file the run wrote (added from elsewhere?)"
    assert invoke("report", str(run)) == (
        1,
        f"Error: {run}: {added}: Spark reads every file in rebalances/assignor=... as the run's "
        "rows; move that file out of the run's folder to keep the run\n",
    )
    _damage(run)
    assert invoke("report", str(run)) == (
        1,
        f"Error: {run}: damaged run: {shown} has bytes changed since it was written, and "
        f"{added}; simulate it again with the code that wrote it (other code), or with this "
        "code and another --out (this code's --overwrite would delete that code's run)\n",
    )


def test_a_runs_own_files_are_never_named_as_the_users(tmp_path: Path) -> None:
    """What simulate, Spark and report write in a run's folder (markers, checksum files, the
    manifest, the report's page, id and CSV files, an interrupted render's staging), or a
    desktop leaves there, is never named among the user's files that --overwrite would
    delete; the user's are, a folder once."""
    from streamassign.cli import REPORT_ID
    from streamassign.cli.run_folders import users_files
    from streamassign.pipeline.report import CSV_FILES

    run = tmp_path / "run"
    rows = run / "rebalances" / "assignor=task%3Asticky"
    rows.mkdir(parents=True)
    (run / "manifest").mkdir()
    (run / "report").mkdir()
    (run / ".report.partial-20261129T133447Z-4aa676").mkdir()
    own = [
        "manifest/part-00000.json",
        "manifest/.part-00000.json.crc",
        "rebalances/_SUCCESS",
        "rebalances/._SUCCESS.crc",
        f"{rows.relative_to(run)}/part-00000-a9a8.c000.snappy.parquet",
        f"{rows.relative_to(run)}/.part-00000-a9a8.c000.snappy.parquet.crc",
        "report/report.html",
        f"report/{REPORT_ID}",
        *(f"report/{name}" for name in CSV_FILES),
        ".DS_Store",  # a desktop's, nobody's work: never named, never blocks a report
        "report/.DS_Store",
        "rebalances/Thumbs.db",
    ]
    for shown in own:
        (run / shown).write_bytes(b"PAR1")
    assert users_files(str(run)) == []
    (run / "report" / "old").mkdir()
    (run / "report" / "Thumbs.db").mkdir()  # a folder of a litter file's name is someone's
    for shown in ("notes.txt", "manifest/mine.json", "rebalances/notes.txt", "report/old/a.md"):
        (run / shown).write_text("mine")
    assert users_files(str(run)) == [
        "notes.txt",
        "manifest/mine.json",
        "rebalances/notes.txt",
        "report/Thumbs.db/",
        "report/old/",
    ]


def test_plan_standbys_passes_by_a_kept_run_whose_report_folder_holds_the_users_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """plan-standbys printed simulate --report over a run it keeps whose report lost its page
    and holds the user's note: that command replaced report/ whole, deleting the note; it
    now refuses, so the plan passes the run by."""

    def note_beside_a_lost_page(run: Path) -> None:
        folder = _an_earlier_report(run)
        (folder / "report.html").unlink()
        (folder / "my-analysis.md").write_text("mine")

    _plan_passes_by(monkeypatch, tmp_path, note_beside_a_lost_page)


def test_report_and_kept_runs_share_which_code_wrote_a_run_without_an_import_cycle() -> None:
    """report imported kept_runs' private _other_code inside a function, since kept_runs
    imports report at its top (a cycle worked around). Both take it from cli.provenance, at
    their top, which imports neither; the rerun remedy follows it."""
    import ast

    from streamassign.cli import kept_runs, provenance, report

    def imported(module: object) -> set[str]:
        tree = ast.parse(Path(str(getattr(module, "__file__", ""))).read_text())
        return {str(node.module) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}

    assert "kept_runs" not in imported(report) and "report" not in imported(provenance)
    assert report.other_code is kept_runs.other_code is provenance.other_code
    manifest = {"code_sha256": "abc123" * 10 + "abcd", "assignors": ["task:sticky"]}
    assert report._rerun_remedy("/runs/x", manifest).startswith(
        "simulate it again with the code that wrote it (other code)"
    )
