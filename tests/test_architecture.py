"""The layering of the project, read from its source: the library (specdec/) at the bottom, the experiments that
write results above it, the analysis that reads them beside them. Every import counts, also those inside functions
and under TYPE_CHECKING."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

PACKAGES = ("specdec", "experiments", "analysis")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


def imported_names(path: Path, name: str) -> set[str]:
    """Every module a file imports, absolute; ``from package import name`` also as ``package.name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports."""
    modules = project_modules()
    return {name: {imported for imported in imported_names(path, name) if imported in modules and imported != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def imports_of(package: str, graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {name: imported for name, imported in graph.items() if name.split(".")[0] == package}


def test_the_graph_sees_every_package():
    graph = import_graph()
    assert {name.split(".")[0] for name in graph} == set(PACKAGES)
    assert "specdec.results" in graph["experiments.rundir"] and "specdec.results" in graph["analysis.load"]
    assert "experiments.rundir" in graph["experiments.runner"]  # from experiments import rundir


def test_imports_inside_functions_and_under_type_checking_count(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specdec.decode import Decoder\n"
                      "def f():\n    import analysis.load\n    from . import sibling\n")
    names = imported_names(source, "experiments.module")
    assert {"specdec.decode", "analysis.load", "experiments.sibling"} <= names


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_experiments_never_import_analysis():
    """The writer of results stands below their reader: running an experiment needs nothing of analysis/."""
    for name, imported in imports_of("experiments", import_graph()).items():
        assert not {m for m in imported if m.split(".")[0] == "analysis"}, name


def test_the_library_imports_neither_experiments_nor_analysis():
    for name, imported in imports_of("specdec", import_graph()).items():
        assert all(m.split(".")[0] == "specdec" for m in imported), name


def test_benches_use_no_cache_internals():
    """Timing a forward is specdec.profile's job; the cache belongs to the decode loop."""
    for name, imported in imports_of("experiments", import_graph()).items():
        assert "specdec.cache" not in imported, name


def test_running_an_experiment_loads_neither_analysis_nor_pandas():
    code = ("import sys, experiments.runner, experiments.run; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'analysis', 'pandas'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


# What architecture pass 2 promised, read from the source ---------------------------------------------------------

CONCRETE_PARTS = ("specdec.drafters", "specdec.strategies", "specdec.policies", "specdec.tree", "specdec.ngram",
                  "specdec.early_exit", "specdec.dynamic_tree", "specdec.cross_tokenizer")


@pytest.mark.parametrize("module", ["step", "decode", "device_loop"])
def test_the_loop_depends_on_interfaces_only(module):
    """The step and its two drivers ask no part what it is (no isinstance) and import no concrete drafter, strategy,
    policy or tree module: parts come in through the interfaces and declare what they can do."""
    path = REPO / "specdec" / f"{module}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert "isinstance" not in calls and "type" not in calls
    imported = imported_names(path, f"specdec.{module}")
    assert not {name for name in imported for part in CONCRETE_PARTS if name == part or name.startswith(part + ".")}


def test_no_module_keeps_a_cache_of_its_own():
    """Tensors kept between calls (static buffers, tree layouts on a device, compiled forwards) hang off an owner
    whose ``release`` frees them (a CachedModel, a drafter); no module-level memo (functools' caches) holds any."""
    for path in sorted((REPO / "specdec").rglob("*.py")):
        decorators = [ast.unparse(decorator) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                      if isinstance(node, (ast.FunctionDef, ast.ClassDef)) for decorator in node.decorator_list]
        assert not [name for name in decorators if "cache" in name], path


def test_no_module_keeps_a_registry_keyed_by_object_identity():
    """Caches and compiled forwards belong to the CachedModel their Decoder or drafter owns; no module-level
    table keyed by id(...) outlives them."""
    for path in sorted((REPO / "specdec").rglob("*.py")):
        calls = [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id"]
        assert not calls, path


def test_a_cache_has_one_rollback_and_only_its_module_calls_the_helpers():
    """KVCache's interface is feed / keep / select_rows / fix_shapes: ``keep`` is the one rollback. The masked cache's helpers
    (crop, compact, grow) and the lean cache's gather are called from specdec/cache.py alone."""
    from specdec.cache import KVCache

    assert {name for name in vars(KVCache) if not name.startswith("_")} == {"feed", "keep", "select_rows", "fix_shapes"}
    helpers = ("crop_tail", "compact", "grow", "gather_kept", "leave_dense")
    for path in sorted((REPO / "specdec").rglob("*.py")):
        if path.name == "cache.py":
            continue
        attributes = {node.attr for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                      if isinstance(node, ast.Attribute)}
        assert not attributes & set(helpers), path
