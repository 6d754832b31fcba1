"""The package's import graph: no cycle among mhckpt's modules, and no module
imports another module's private (underscore) name.

Read from the installed package's sources with ``ast`` (nothing is imported
but ``mhckpt`` itself). Run alone, it prints the graph::

    python python/tests/test_structure.py [PACKAGE_DIR]
"""
from __future__ import annotations

import ast
import os
import sys
from typing import Dict, List, Set, Tuple

PACKAGE = "mhckpt"


def package_dir() -> str:
    import mhckpt

    return os.path.dirname(mhckpt.__file__)


def modules(root: str) -> Dict[str, str]:
    """Module name -> file of every .py file of the package under ``root``."""
    out = {}
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = os.path.relpath(dirpath, root)
        parts = [PACKAGE] + ([] if rel == "." else rel.split(os.sep))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            name = ".".join(parts if f == "__init__.py" else parts + [f[:-3]])
            out[name] = os.path.join(dirpath, f)
    return out


def _is_package(name: str, files: Dict[str, str]) -> bool:
    return files[name].endswith("__init__.py")


def _base(name: str, files: Dict[str, str], level: int, module: str) -> str:
    """The absolute module of ``from <level dots><module> import ...`` in ``name``."""
    parts = name.split(".")
    if not _is_package(name, files):
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def imports(name: str, files: Dict[str, str], module_level: bool) -> List[Tuple[str, str]]:
    """(module imported, name imported from it or "") for each import
    statement of module ``name`` between the package's modules; only the
    statements run at import time when ``module_level`` (not those inside
    functions)."""
    with open(files[name]) as f:
        tree = ast.parse(f.read(), files[name])
    if module_level:
        nodes = []
        todo = list(tree.body)
        while todo:  # statements at module level, in if/try blocks too, not in defs
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                nodes.append(n)
                continue
            todo.extend(ast.iter_child_nodes(n))
    else:
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    out = []
    for n in nodes:
        if isinstance(n, ast.Import):
            out += [(a.name, "") for a in n.names if a.name.split(".")[0] == PACKAGE]
            continue
        base = _base(name, files, n.level, n.module or "") if n.level else (n.module or "")
        if base.split(".")[0] != PACKAGE:
            continue
        for a in n.names:
            sub = f"{base}.{a.name}"
            if sub in files or (sub.rsplit(".", 1)[-1] == "_core"):
                out.append((sub, ""))  # a submodule
            else:
                out.append((base, a.name))
    return [(m, what) for m, what in out if m in files]


def graph(files: Dict[str, str], module_level: bool) -> Dict[str, Set[str]]:
    return {m: {t for t, _ in imports(m, files, module_level) if t != m} for m in files}


def cycles(g: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle through each strongly connected component that has one."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    comps: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return comps


def private_imports(files: Dict[str, str]) -> List[str]:
    """``module: from other import _name`` for every private name a module
    imports from another one (private modules themselves may be imported)."""
    out = []
    for m in files:
        for target, what in imports(m, files, module_level=False):
            if what.startswith("_") and not what.startswith("__") and target != m:
                out.append(f"{m}: from {target} import {what}")
    return out


def test_no_import_cycle_at_module_level():
    files = modules(package_dir())
    assert cycles(graph(files, module_level=True)) == []


def test_no_import_cycle_with_lazy_imports():
    # Imports inside functions count too: no module needs another that needs it.
    files = modules(package_dir())
    assert cycles(graph(files, module_level=False)) == []


def test_no_private_name_imported_across_modules():
    assert private_imports(modules(package_dir())) == []


def test_the_checker_sees_the_package():
    files = modules(package_dir())
    assert {"mhckpt", "mhckpt._manager", "mhckpt.orbax", "mhckpt.orbax.args"} <= set(files)
    g = graph(files, module_level=True)
    assert "mhckpt._manager" in g["mhckpt"]
    assert "mhckpt._saving" in g["mhckpt._manager"]
    assert "mhckpt._leaves" in g["mhckpt._saving"]


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else package_dir()
    files = modules(root)
    for lazy in (False, True):
        g = graph(files, module_level=not lazy)
        print("imports, inside functions too:" if lazy else "module-level imports:")
        for m in sorted(g):
            if g[m]:
                print(f"  {m} -> {', '.join(sorted(g[m]))}")
        print("  cycles:", cycles(g) or "none")
    print("private names imported:", private_imports(files) or "none")
