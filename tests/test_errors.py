"""Every error streamassign raises on purpose is a ``StreamAssignError``, and those that plain
Python errors used to be keep their old base class, so callers catching either keep working."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import json
import pickle
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import streamassign
from streamassign import Subtopology, TaskId, TopicPartition, Topology, errors
from streamassign._ids import as_task
from streamassign.aiokafka import GroupAssignor, ProcessHost
from streamassign.consumer import MemberData, Subscription
from streamassign.consumer._common import prepare
from streamassign.errors import (
    InvalidTaskIdError,
    ReservedKeyError,
    StoreKeyTypeError,
    StreamAssignError,
    TaskIdTypeError,
)
from streamassign.protocol import AssignmentInfo
from streamassign.runtime import App
from streamassign.runtime.changelog import COMMIT_KEY, StoreState
from streamassign.runtime.stores import MemoryStore

PACKAGE_DIR = Path(streamassign.__file__).parent
PLAIN_ERRORS = {
    "Exception",
    "ValueError",
    "TypeError",
    "KeyError",
    "LookupError",
    "IndexError",
    "RuntimeError",
    "OSError",
}


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


#: Error classes still defined beside their code rather than in ``streamassign.errors``: none
#: left (issue 22 §2). Kept as the place to name one deliberately, e.g. during a move.
NOT_YET_IN_ERRORS: set[str] = set()

#: Classes moved to ``streamassign.errors``, by the module they were defined in before: still
#: importable from there (the same class), so no user import breaks.
MOVED_TO_ERRORS = {
    "streamassign.runtime": "RuntimeConfigError",
    "streamassign.runtime._topics": "InternalTopicError",
    "streamassign.runtime.app": "RuntimeConfigError",
    "streamassign.runtime.processing": "ProcessingError",
    "streamassign.aiokafka.consumer": "AssignmentValidationError",
    "streamassign.consumer": "UserDataError",
    "streamassign.consumer.userdata": "UserDataError",
    "streamassign.localstate": "StateDirectoryLockedError",
    "streamassign.pipeline": "PipelineError",
    "streamassign.pipeline.scenarios": "PipelineError",
    "streamassign.protocol": "ProtocolError",
}


def test_new_error_classes_are_defined_in_errors_py() -> None:
    public = {n for n, cls in exception_classes().items() if not cls.__name__.startswith("_")}
    elsewhere = {n for n in public if not n.startswith("streamassign.errors.")}
    assert elsewhere == NOT_YET_IN_ERRORS


def test_the_errors_page_names_every_error_class() -> None:
    """docs/errors.md is where a user looks a logged class up: it must name every one."""
    page = (PACKAGE_DIR.parent / "docs" / "errors.md").read_text()
    classes = [
        name
        for name, value in inspect.getmembers(errors, inspect.isclass)
        if issubclass(value, BaseException) and value.__module__ == errors.__name__
    ]
    assert classes
    assert [name for name in classes if not re.search(rf"\b{name}`", page)] == []


@pytest.mark.parametrize(("module", "name"), sorted(MOVED_TO_ERRORS.items()))
def test_moved_classes_stay_importable_from_their_old_module(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


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


#: Modules that still raise plain Python errors on purpose (issue #22 §2). A ratchet: no other
#: module may, and a module leaves the list once it raises only typed errors.
STILL_RAISING_PLAIN_ERRORS: set[str] = set()


def test_modules_raise_no_plain_python_errors() -> None:
    offenders = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        module = path.relative_to(PACKAGE_DIR).as_posix()
        if module not in STILL_RAISING_PLAIN_ERRORS:
            offenders += [f"{module}: {name}" for name in sorted(raised_names(path) & PLAIN_ERRORS)]
    assert offenders == []
    assert all((PACKAGE_DIR / module).is_file() for module in STILL_RAISING_PLAIN_ERRORS)


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


def test_topology_errors_are_typed_and_keep_their_old_bases() -> None:
    with pytest.raises(errors.TopologyTypeError, match="must be a str, got int 7") as not_str:
        Subtopology(0, source_topics=[7])  # type: ignore[list-item]
    assert isinstance(not_str.value, TypeError)
    assert isinstance(not_str.value, errors.TopologyError)
    topology = Topology([Subtopology(0, source_topics=["orders"], stores=["totals"])])
    with pytest.raises(errors.NotInTopologyError, match="no subtopology 3") as missing:
        topology.subtopology(3)
    assert isinstance(missing.value, KeyError)
    for lookup in (topology.subtopology_of, topology.subtopology_of_store, topology.writers):
        with pytest.raises(errors.NotInTopologyError, match="'clicks'"):
            lookup("clicks")


def test_encode_errors_are_typed_and_keep_value_error() -> None:
    with pytest.raises(errors.EncodeError, match="generation must be an int") as out_of_range:
        MemberData(generation=2**31)
    assert isinstance(out_of_range.value, ValueError)
    info = AssignmentInfo(
        topics={0: {"orders": 2}},
        active_by_host={"a:1": frozenset({TaskId(0, 0)}), "b:1": frozenset({TaskId(0, 0)})},
    )
    with pytest.raises(errors.EncodeError, match="task 0_0 active on two hosts"):
        info.encode()


def test_consumer_input_errors_are_typed_and_keep_their_old_bases() -> None:
    with pytest.raises(errors.AssignmentTypeError, match="not the string 'orders'") as one:
        Subscription(topics="orders")  # type: ignore[arg-type]
    assert isinstance(one.value, TypeError)
    with pytest.raises(errors.AssignmentInputError, match="'orders' must be an int >= 0: -1"):
        prepare({"orders": -1}, {"m1": Subscription(topics=["orders"])})


def test_process_options_raise_config_errors(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="unknown assignor 'fastest'") as unknown:
        GroupAssignor.create("fastest")
    assert isinstance(unknown.value, ValueError)
    topology = Topology([Subtopology(0, source_topics=["orders"])])
    with pytest.raises(errors.ConfigError, match="threads must be >= 1, got 0"):
        ProcessHost(topology, bootstrap_servers="localhost:9", state_dir=tmp_path, threads=0)
    with pytest.raises(errors.ConfigError, match="an application id is needed"):
        ProcessHost(topology, bootstrap_servers="localhost:9", state_dir=tmp_path)
    with pytest.raises(errors.TopologyError, match=r"^topology x has no tasks"):
        ProcessHost(Topology([], name="x"), bootstrap_servers="localhost:9", state_dir=tmp_path)


@pytest.mark.parametrize("name", ["", "x"])
def test_a_topology_without_tasks_is_still_a_config_error_to_hosts(
    tmp_path: Path, name: str
) -> None:
    """An unnamed empty topology was refused with ``ConfigError`` (no application id) before
    the no-task check came first: ``except ConfigError`` around a host keeps catching it."""
    empty = Topology([], name=name)
    with pytest.raises(errors.ConfigError, match="has no tasks") as host:
        ProcessHost(empty, bootstrap_servers="localhost:9", state_dir=tmp_path)
    with pytest.raises(errors.ConfigError, match="has no tasks") as app:
        App(empty, {}, bootstrap_servers="localhost:9", state_dir=tmp_path)
    for refused in (host.value, app.value):
        assert isinstance(refused, errors.NoTasksError)
        assert isinstance(refused, errors.TopologyError) and isinstance(refused, ValueError)


#: Run in a fresh interpreter: per case, the top-level modules made unimportable (None in
#: sys.modules, as if not installed), then what importing the package (and reading one of its
#: names, when given) raised.
_WITHOUT_EXTRA = """
import importlib, json, sys
from streamassign.errors import StreamAssignError
seen = {
    "import streamassign loads importlib.metadata": "importlib.metadata" in sys.modules,
    "import streamassign loads packaging": "packaging" in sys.modules,
}
for package, name, blocked in [
    ("streamassign.aiokafka", None, "aiokafka"),
    ("streamassign.runtime", None, "aiokafka"),
    ("streamassign.faust", None, "faust"),
    ("streamassign.runtime", "QueryServer", "aiohttp"),
    ("streamassign.runtime.query_server", None, "aiohttp"),
]:
    for loaded in [n for n in sys.modules if n.startswith(package)]:
        del sys.modules[loaded]
    sys.modules[blocked] = None
    try:
        module = importlib.import_module(package)
        if name is not None:
            getattr(module, name)
    except ModuleNotFoundError as exc:  # what code that caught the bare error catches
        feature = package if name is None else f"{package}.{name}"
        seen[feature] = [type(exc).__name__, isinstance(exc, StreamAssignError), exc.name, str(exc)]
    del sys.modules[blocked]
print(json.dumps(seen))
"""


def test_a_package_without_its_extra_names_the_extra_to_install() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRA], capture_output=True, text=True, check=True
    )

    def missing(feature: str, module: str, distribution: str, extra: str) -> list[object]:
        line = f"{feature} needs {distribution}, from the {extra} extra"
        install = f"pip install 'streamassign[{extra}]'"
        return ["MissingExtraError", True, module, f"{line}: {install}"]

    assert json.loads(ran.stdout) == {
        # About 20 ms of email, csv, zipfile...: only a version check needs it.
        "import streamassign loads importlib.metadata": False,
        "import streamassign loads packaging": False,  # only an extra's floor check does
    } | {
        feature: missing(feature, module, distribution, extra)
        for feature, module, distribution, extra in [
            ("streamassign.aiokafka", "aiokafka", "aiokafka", "aiokafka"),
            ("streamassign.runtime", "aiokafka", "aiokafka", "runtime"),
            ("streamassign.faust", "faust", "faust-streaming", "faust"),
            ("streamassign.runtime.QueryServer", "aiohttp", "aiohttp", "runtime"),
            ("streamassign.runtime.query_server", "aiohttp", "aiohttp", "runtime"),
        ]
    }


def test_a_module_missing_inside_an_installed_package_is_not_blamed_on_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "installed_but_broken").mkdir()
    (tmp_path / "installed_but_broken" / "__init__.py").write_text("import gone_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as raised:
        errors.require_extra("x", "y", {"installed_but_broken": "installed-but-broken"})
    assert raised.type is ModuleNotFoundError
    assert raised.value.name == "gone_dependency"


def installed_as(monkeypatch: pytest.MonkeyPatch, versions: dict[str, str]) -> None:
    """pip's metadata reports ``versions`` for those distributions (no real downgrade)."""
    real = importlib.metadata.version

    def version(distribution: str) -> str:
        if distribution in versions:
            return versions[distribution]
        return real(distribution)

    monkeypatch.setattr(importlib.metadata, "version", version)


@pytest.mark.parametrize(
    "installed", ["0.13.0", "0.9.2", "0.14.0rc1", "0.14.0.dev3", "0.13.9+local", "v0.13"]
)
def test_a_package_below_its_extras_floor_names_the_version_the_range_and_the_command(
    monkeypatch: pytest.MonkeyPatch, installed: str
) -> None:
    installed_as(monkeypatch, {"kafka-dist": installed})
    with pytest.raises(errors.ExtraVersionError) as raised:
        errors.require_extra("streamassign.thing", "runtime", {"json": "kafka-dist>=0.14,<0.15"})
    assert str(raised.value) == (
        f"streamassign.thing needs kafka-dist>=0.14,<0.15, from the runtime extra, but "
        f"kafka-dist {installed} is installed: pip install 'streamassign[runtime]'"
    )
    assert isinstance(raised.value, errors.MissingExtraError)
    assert isinstance(raised.value, ModuleNotFoundError)
    assert (raised.value.name, raised.value.installed, raised.value.needed) == (
        "json",
        installed,
        ">=0.14,<0.15",
    )
    again = pickle.loads(pickle.dumps(raised.value))
    assert (type(again), str(again), again.name, again.installed, again.needed) == (
        errors.ExtraVersionError,
        str(raised.value),
        "json",
        installed,
        ">=0.14,<0.15",
    )


@pytest.mark.parametrize(
    "installed",
    ["0.14", "0.14.0", "0.14.0.post1", "0.14.2", "0.15.0", "1!0.1", "0.14.0+local", "fork-7"],
)
def test_a_package_at_or_above_its_extras_floor_passes(
    monkeypatch: pytest.MonkeyPatch, installed: str
) -> None:
    """Above the ceiling too: a newer version may work, and pip said so when installing it.
    An epoch (``1!``) orders above every version without one; a version pip cannot order (a
    fork's own scheme) is not judged."""
    installed_as(monkeypatch, {"kafka-dist": installed})
    errors.require_extra("streamassign.thing", "runtime", {"json": "kafka-dist>=0.14,<0.15"})


def test_a_package_without_pip_metadata_is_not_judged_by_version() -> None:
    errors.require_extra("x", "y", {"json": "no-such-distribution-here>=99"})


def test_a_requirement_without_a_floor_reads_no_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare name, or a ceiling alone, is a presence check: no look-up in pip's metadata (a
    few milliseconds each)."""
    looked_up: list[str] = []

    def version(distribution: str) -> str:
        looked_up.append(distribution)
        return "1.0"

    monkeypatch.setattr(importlib.metadata, "version", version)
    errors.require_extra("x", "y", {"json": "json-dist", "re": "re-dist<2"})
    assert looked_up == []
    errors.require_extra("x", "y", {"json": "json-dist>=0.1,<2"})
    assert looked_up == ["json-dist"]


def test_the_query_classes_check_aiohttp_at_their_first_read_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each read of ``streamassign.runtime.QueryServer`` checked aiohttp's version (about a
    millisecond, some 200 times the read itself): now the first read only (the attribute,
    then the query server's module), and the classes are the package's own after."""
    import streamassign.runtime as runtime
    from streamassign.runtime import query_server

    looked_up: list[str] = []
    real = importlib.metadata.version

    def version(distribution: str) -> str:
        looked_up.append(distribution)
        return real(distribution)

    monkeypatch.setattr(importlib.metadata, "version", version)
    for name in ("QueryServer", "QueryClient"):  # not read yet, nor kept after the test
        monkeypatch.setitem(vars(runtime), name, None)  # (getattr would read it now)
        monkeypatch.delitem(vars(runtime), name)
    monkeypatch.delitem(sys.modules, "streamassign.runtime.query_server")
    monkeypatch.delitem(sys.modules, "streamassign.runtime._query_extra")
    monkeypatch.delattr(runtime, "query_server")
    monkeypatch.delattr(runtime, "_query_extra")
    read = [runtime.QueryServer, runtime.QueryClient] * 3
    assert looked_up == ["aiohttp", "aiohttp"]
    fresh = sys.modules["streamassign.runtime.query_server"]
    assert read == [fresh.QueryServer, fresh.QueryClient] * 3
    assert vars(runtime)["QueryServer"] is fresh.QueryServer
    assert fresh is not query_server  # imported again, its own guard asked again: no look-up


#: Run in a fresh interpreter: per case, pip's metadata reports the given versions, then what
#: importing the module raised (None: it imported).
_BELOW_FLOOR = """
import importlib, importlib.metadata, json, sys
from streamassign.errors import ExtraVersionError
real = importlib.metadata.version
seen = {}
for module, versions in [
    ("streamassign.runtime", {"aiokafka": "0.13.0"}),
    ("streamassign.aiokafka", {"aiokafka": "0.13.0"}),
    ("streamassign.aiokafka", {"aiokafka": "0.10.2"}),
    ("streamassign.faust", {"faust-streaming": "0.11.3"}),
    ("streamassign.runtime.query_server", {"aiohttp": "3.8.6"}),
    ("streamassign.runtime.stores", {"rocksdict": "0.3.23"}),
]:
    for loaded in [n for n in sys.modules if n.startswith(module)]:
        del sys.modules[loaded]
    importlib.metadata.version = lambda d, versions=versions: versions.get(d) or real(d)
    try:
        loaded = importlib.import_module(module)
        if module.endswith(".stores"):  # checked where a RocksDB store is first asked for
            loaded.require_store_library("rocksdb")
        said = None
    except ExtraVersionError as exc:
        said = str(exc)
    seen[f"{module} {versions}"] = said
print(json.dumps(seen))
"""


def test_importing_a_package_below_its_extras_floor_fails_at_once() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _BELOW_FLOOR], capture_output=True, text=True, check=True
    )

    def below(module: str, requirement: str, installed: str, extra: str) -> str:
        distribution = requirement.split(">")[0]
        return (
            f"{module} needs {requirement}, from the {extra} extra, but {distribution} "
            f"{installed} is installed: pip install 'streamassign[{extra}]'"
        )

    assert list(json.loads(ran.stdout).values()) == [
        below("streamassign.runtime", "aiokafka>=0.14,<0.15", "0.13.0", "runtime"),
        None,  # the aiokafka extra allows 0.11 on
        below("streamassign.aiokafka", "aiokafka>=0.11,<0.15", "0.10.2", "aiokafka"),
        below("streamassign.faust", "faust-streaming>=0.12,<0.16", "0.11.3", "faust"),
        below("streamassign.runtime.query_server", "aiohttp>=3.9,<4", "3.8.6", "runtime"),
        below("store_kind='rocksdb'", "rocksdict>=0.3.24,<0.4", "0.3.23", "runtime")
        + " (or use store_kind='memory')",
    ]


def test_the_guards_require_what_pyproject_s_extras_install() -> None:
    from streamassign.aiokafka import _extra as aiokafka_extra
    from streamassign.faust import _extra as faust_extra
    from streamassign.runtime import _extra as runtime_extra

    extras = tomllib.loads((PACKAGE_DIR.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    guarded = {
        "aiokafka": aiokafka_extra.REQUIREMENTS.values(),
        "faust": faust_extra.REQUIREMENTS.values(),
        "runtime": [
            *runtime_extra.REQUIREMENTS.values(),
            *runtime_extra.QUERIES.values(),
            *runtime_extra.STORES.values(),
        ],
    }
    for extra, requirements in guarded.items():
        assert set(requirements) <= set(extras[extra]), extra
