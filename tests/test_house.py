"""The package's house rules, read from its source: no import circles, no file over 500 lines.

An import circle is a set of modules that import each other at module level, directly or
through others. An edge goes to the module imported (`import a.b`, `from a import b` where b
is a module), or to a package itself when a name defined in its `__init__` is imported (`from
a import name`): a module that needs its package's own names while that package's `__init__`
imports it is a circle. Imports inside functions (lazy) and under `if TYPE_CHECKING:` do not
run at import time and are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 500


def modules(src: Path = SRC) -> dict[str, Path]:
    out = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _module_level_imports(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            test = node.test
            if getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
                yield from _module_level_imports(node.orelse)
            else:
                yield from _module_level_imports(node.body)
                yield from _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _module_level_imports(block)


def import_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project's modules it imports at module level (see the module docstring)."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _module_level_imports(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in mods else base)
        edges[name] = {m for m in targets if m in mods and m != name}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_package_has_no_import_circles():
    mods = modules()
    assert "trainspeed.telemetry.monitor" in mods and len(mods) > 200
    assert circles(import_edges(mods)) == []


def test_the_circle_finder_sees_direct_and_package_circles(tmp_path):
    # a <-> b directly; pkg/__init__ imports pkg.mod, which needs a name of pkg's own; pkg2's
    # modules import each other's modules only (no circle); lazy and TYPE_CHECKING imports are
    # no edges
    files = {
        "a.py": "import b\n",
        "b.py": "from a import thing\n",
        "c.py": "def f():\n    import a\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import c\nimport a\n",
        "e.py": "import d\n",
        "c2.py": "import c\n",
        "pkg/__init__.py": "from pkg.mod import run\nLIMIT = 3\n",
        "pkg/mod.py": "from . import LIMIT\n",
        "pkg2/__init__.py": "from pkg2.mod import run\n",
        "pkg2/mod.py": "from pkg2 import other\n",
        "pkg2/other.py": "x = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    edges = import_edges(modules(tmp_path))
    assert edges["c"] == set() and edges["d"] == {"a"} and edges["pkg2.mod"] == {"pkg2.other"}
    assert sorted(circles(edges)) == [["a", "b"], ["pkg", "pkg.mod"]]


def test_no_source_file_is_over_500_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
