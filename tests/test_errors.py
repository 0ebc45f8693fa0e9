"""Every error streamassign raises on purpose is a ``StreamAssignError``, and those that plain
Python errors used to be keep their old base class, so callers catching either keep working."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import streamassign
from streamassign import TaskId, TopicPartition
from streamassign._ids import as_task
from streamassign.errors import (
    InvalidTaskIdError,
    ReservedKeyError,
    StoreKeyTypeError,
    StreamAssignError,
    TaskIdTypeError,
)
from streamassign.runtime.changelog import COMMIT_KEY, StoreState
from streamassign.runtime.stores import MemoryStore

PACKAGE_DIR = Path(streamassign.__file__).parent
PLAIN_ERRORS = {"Exception", "ValueError", "TypeError", "KeyError", "LookupError", "RuntimeError"}


def all_modules() -> list[str]:
    names = [streamassign.__name__]
    for info in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="streamassign."):
        names.append(info.name)
    return sorted(names)


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in streamassign, by qualified name (all extras installed:
    the dev environment has them)."""
    found: dict[str, type[BaseException]] = {}
    for name in all_modules():
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{value.__qualname__}"] = value
    return found


def test_every_public_exception_class_is_a_stream_assign_error() -> None:
    classes = exception_classes()
    assert "streamassign.errors.ReservedKeyError" in classes  # the scan sees errors.py
    # Private classes are control flow inside one module (e.g. protocol's ``_RoomExceeded``),
    # caught there and never seen by a caller.
    public = {name: cls for name, cls in classes.items() if not cls.__name__.startswith("_")}
    assert sorted(n for n, cls in public.items() if not issubclass(cls, StreamAssignError)) == []


#: Error classes still defined beside their code rather than in ``streamassign.errors`` (issue
#: #22 §2 wants them there; each module would keep importing its class, so its path stays). A
#: ratchet: the list may only shrink.
NOT_YET_IN_ERRORS = {
    "streamassign.aiokafka.consumer.AssignmentValidationError",
    "streamassign.consumer.userdata.UserDataError",
    "streamassign.localstate.StateDirectoryLockedError",
    "streamassign.pipeline.scenarios.PipelineError",
    "streamassign.protocol.ProtocolError",
    "streamassign.runtime._topics.InternalTopicError",
    "streamassign.runtime.processing.ProcessingError",
    "streamassign.runtime.app.RuntimeConfigError",
}


def test_new_error_classes_are_defined_in_errors_py() -> None:
    public = {n for n, cls in exception_classes().items() if not cls.__name__.startswith("_")}
    elsewhere = {n for n in public if not n.startswith("streamassign.errors.")}
    assert elsewhere == NOT_YET_IN_ERRORS


def raised_names(path: Path) -> set[str]:
    """Names of the classes ``path`` raises directly (``raise Name(...)`` / ``raise Name``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name):
                names.add(target.id)
    return names


def test_every_raised_streamassign_class_is_a_stream_assign_error() -> None:
    """The same from the other side: whatever a module raises by a name that is an exception
    class of streamassign (so also classes imported under another module's name)."""
    by_name = {cls.__name__: cls for cls in exception_classes().values()}
    offenders = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for name in raised_names(path):
            cls = by_name.get(name)
            private = name.startswith("_")
            if cls is not None and not private and not issubclass(cls, StreamAssignError):
                offenders.append(f"{path.relative_to(PACKAGE_DIR)}: {name}")
    assert offenders == []


@pytest.mark.parametrize("module", ["streamassign/_ids.py", "streamassign/runtime/changelog.py"])
def test_modules_cleaned_up_raise_no_plain_python_errors(module: str) -> None:
    path = PACKAGE_DIR.parent / module
    assert raised_names(path) & PLAIN_ERRORS == set()


def test_task_id_errors_are_typed_and_keep_their_old_bases() -> None:
    with pytest.raises(InvalidTaskIdError, match="'x_1'") as parse_error:
        TaskId.parse("x_1")
    assert isinstance(parse_error.value, ValueError)
    with pytest.raises(TaskIdTypeError, match="not a task id") as type_error:
        as_task(3.5)  # type: ignore[arg-type]
    assert isinstance(type_error.value, TypeError)
    with pytest.raises(InvalidTaskIdError):
        as_task("1-2")


def test_store_key_errors_are_typed_and_keep_their_old_bases() -> None:
    state = StoreState("totals", TopicPartition("app-totals-changelog", 0), MemoryStore())
    with pytest.raises(ReservedKeyError) as reserved:
        state.put(COMMIT_KEY, b"1")
    assert isinstance(reserved.value, ValueError)
    with pytest.raises(StoreKeyTypeError) as not_bytes:
        state.put("text", b"1")  # type: ignore[arg-type]
    assert isinstance(not_bytes.value, TypeError)
