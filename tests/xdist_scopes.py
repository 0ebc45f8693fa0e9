"""How scripts/test.sh splits the suite between its two pytest processes (pytest-xdist).

Each process starts its own session fixtures. A scope runs whole in one process: every test of
``tests/integration`` (they share the session's broker, and run one at a time as without xdist),
every test of ``tests/pipeline`` (they share the local Spark session), and each other file (its
module fixtures then start once). The broker's scope goes out first and Spark's second, so the
two longest scopes start at once; the other files follow, those with the most tests first.

xdist's own ``--dist loadgroup`` cannot do this here: it tags ``item._nodeid``, which pytest 9.2
no longer reads (``Node.nodeid`` comes from ``_id``), so its groups fall apart test by test.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

#: Folders whose tests share a session fixture that starts a process, longest first.
SHARED_FIXTURE_FOLDERS = ("tests/integration/", "tests/pipeline/")


# The two hooks overridden below are xdist's own (3.x): renamed, the folders would silently
# split file by file again (two brokers, integration tests two at a time): fail instead.
if not all(hasattr(LoadScopeScheduling, hook) for hook in ("_split_scope", "_assign_work_unit")):
    raise ImportError("pytest-xdist's LoadScopeScheduling changed: update tests/xdist_scopes.py")


class SharedFixtureScheduling(LoadScopeScheduling):
    """``--dist loadscope`` with a folder sharing a session fixture as one scope."""

    def _split_scope(self, nodeid: str) -> str:
        test_file = nodeid.split("::", 1)[0]
        for folder in SHARED_FIXTURE_FOLDERS:
            if test_file.startswith(folder):
                return folder
        return test_file

    def _assign_work_unit(self, node: WorkerController) -> None:
        """The shared fixtures' scopes before the files (the queue is ordered by test count)."""
        for folder in SHARED_FIXTURE_FOLDERS:
            if folder in self.workqueue:
                self.workqueue.move_to_end(folder, last=False)
                break
        super()._assign_work_unit(node)
