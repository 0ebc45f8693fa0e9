"""Architecture rules, checked on the source with ``ast`` (nothing is imported):

- layers import downwards only: core (``streamassign/*.py``, ``streamassign/sticky/``) <
  ``consumer`` < ``aiokafka`` < ``faust``, ``runtime`` < ``pipeline`` < ``cli``; benchmarks and
  examples sit above them all;
- a layer imports only public names of the other layers: no module or name starting with ``_``
  from another layer (inside one layer anything goes);
- the core is pure: it imports the standard library, ``attrs`` and itself, nothing else (but
  ``packaging``, in the one function of ``errors`` that checks an extra's version floor).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "streamassign"

#: Rank of each layer: a module may import layers of lower or equal rank only.
LAYER_RANK = {
    "core": 0,
    "consumer": 1,
    "aiokafka": 2,
    "faust": 3,
    "runtime": 3,
    "pipeline": 4,
    "cli": 5,
    "outside": 6,  # benchmarks/ and examples/: users of the public API
}
CORE_THIRD_PARTY = {"attrs"}
#: Sub-packages that are part of the core (one algorithm split into files, not a layer).
CORE_PACKAGES = {"sticky"}
#: Deliberate exceptions: a deprecated alias in the core that loads its moved name on use; the
#: version floor check of an extra's import (``errors._below``: pip's ordering of versions).
ALLOWED = {
    ("streamassign/grouper.py", "streamassign.faust"),
    ("streamassign/errors.py", "packaging.version"),
}


def layer_of(module: str) -> str:
    """The layer a dotted module name of streamassign belongs to."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return "outside"
    if len(parts) == 1:
        return "core"
    if parts[1] in ("cli", "__main__") or module == "streamassign.pipeline.submit":
        return "cli"  # entry points (``pipeline.submit`` runs the CLI under spark-submit)
    if (ROOT / PACKAGE / parts[1]).is_dir() and parts[1] not in CORE_PACKAGES:
        return parts[1]
    return "core"


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def imports(path: Path, text: str) -> Iterator[tuple[int, str, str | None]]:
    """Every import in ``text``, the source of ``path`` (anywhere, lazy ones included):
    (line, absolute module, name) with name None for ``import x.y``."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                yield node.lineno, target, alias.name


def source_files() -> list[Path]:
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    for outside in ("benchmarks", "examples"):
        files += sorted((ROOT / outside).rglob("*.py"))
    return files


def layer_violations(path: Path, text: str | None = None) -> list[str]:
    """What in ``path`` (or ``text`` given as its source) breaks the layer rules, one line each."""
    importer = module_name(path)
    importer_layer = layer_of(importer) if importer.startswith(PACKAGE) else "outside"
    found = []
    for line, target, name in imports(path, path.read_text() if text is None else text):
        where = f"{path.relative_to(ROOT)}:{line}"
        top = target.split(".")[0]
        if top != PACKAGE:
            allowed = (path.relative_to(ROOT).as_posix(), target) in ALLOWED
            if importer_layer == "core" and not (
                allowed
                or top in sys.stdlib_module_names
                or top in CORE_THIRD_PARTY
                or top == "__future__"
            ):
                found.append(f"{where}: the core imports {target}")
            continue
        # ``from streamassign.x import y`` may name a submodule ``y``: judge its own layer.
        submodule = f"{target}.{name}" if name and (ROOT / PACKAGE / name).is_dir() else target
        target_layer = layer_of(submodule if target == PACKAGE else target)
        if target_layer == importer_layer or (path.relative_to(ROOT).as_posix(), target) in ALLOWED:
            continue
        if LAYER_RANK[target_layer] >= LAYER_RANK[importer_layer]:
            found.append(f"{where}: {importer_layer} imports {target} ({target_layer})")
        private_parts = [part for part in target.split(".") if is_private(part)]
        if private_parts or (name is not None and is_private(name)):
            shown = f"{target}.{name}" if name else target
            found.append(f"{where}: private {shown} imported across layers")
    return found


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path: Path) -> None:
    assert layer_violations(path) == []


def test_the_checker_catches_what_it_should() -> None:
    """The rules above are not vacuous: each kind of violation is reported."""
    faust_module = ROOT / PACKAGE / "faust" / "leader.py"
    core_module = ROOT / PACKAGE / "grouper.py"
    for line in (
        "from ..aiokafka._rejoin import Rejoiner",
        "from ..sticky import _private_helper",
        "from .. import _ids",
        "from ..pipeline import simulate",
        "import streamassign.cli",
    ):
        assert layer_violations(faust_module, line), line
    for line in (
        "import aiokafka",
        "from pyspark.sql import SparkSession",
        "import faust.app",
        "from packaging.version import Version",  # (allowed in errors.py only)
    ):
        assert layer_violations(core_module, line), line
    for line in ("from .aiokafka import streams", "from .faust.leader import faust_topology"):
        assert layer_violations(core_module, line), line
    assert layer_violations(faust_module, "from .._ids import TaskId")
    assert layer_violations(faust_module, "from ..sticky import StickyTaskAssignor") == []
    assert layer_violations(faust_module, "from ._watch import unsized") == []
    assert layer_violations(faust_module, "from .. import TaskId") == []


# -- function length ------------------------------------------------------------------------------

#: "Functions fit on a screen": no function of the package is longer than this many lines (from
#: its ``def`` line to its last line, decorators excluded, docstring included).
MAX_FUNCTION_LINES = 60
#: Functions still longer, by (path, qualified name): to be split, never added to. ``App.__init__``
#: is its 20-parameter public signature and the wiring of its parts (validation is in
#: ``runtime/settings.py``).
LONG_FUNCTIONS = {
    ("streamassign/runtime/app.py", "App.__init__"),
}


def function_lengths(path: Path, text: str | None = None) -> dict[str, int]:
    """Lines of every function in ``path`` (or ``text`` given as its source), by qualified
    name (``Class.method``, ``outer.inner`` for a nested one)."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text() if text is None else text, str(path)), "")
    return lengths


def long_functions() -> dict[tuple[str, str], int]:
    """Functions of the package over :data:`MAX_FUNCTION_LINES` and not allowed to be."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for name, lines in function_lengths(path).items():
            if lines > MAX_FUNCTION_LINES and (relative, name) not in LONG_FUNCTIONS:
                found[relative, name] = lines
    return found


def test_functions_fit_on_a_screen() -> None:
    """Split a function this finds into named steps (see the allowed ones' history)."""
    assert long_functions() == {}


def test_the_long_function_allowlist_names_only_functions_still_too_long() -> None:
    """A renamed, removed or shortened function leaves no stale entry."""
    stale = [
        (path, name)
        for path, name in sorted(LONG_FUNCTIONS)
        if not (ROOT / path).exists()
        or function_lengths(ROOT / path).get(name, 0) <= MAX_FUNCTION_LINES
    ]
    assert stale == []


def test_function_lengths_count_methods_and_nested_functions() -> None:
    source = "class A:\n    def f(self):\n        def g():\n            pass\n        return g\n"
    assert function_lengths(ROOT / PACKAGE / "x.py", source) == {"A.f": 4, "A.f.g": 2}
