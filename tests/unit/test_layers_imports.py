"""The layering of docs/design.md, section 2, checked on the source: every import of every module
under src/nestplan (module level, function level and type-checking only alike) points to its own
layer or a lower one, and no modules import each other in a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import nestplan

PACKAGE = "nestplan"
ROOT = Path(nestplan.__file__).parent

# docs/design.md, section 2, lowest first. A module's layer is that of its first name below the
# package; the package's own __init__ re-exports api and sits with it.
LAYERS: dict[str, int] = {
    "units": 0,
    "errors": 0,
    "inputs": 0,
    "outputs": 0,
    "job": 0,
    "settings": 0,
    "catalog": 0,
    "version": 0,
    "model": 1,
    "hardware": 1,
    "network": 1,
    "strategy": 1,
    "cluster": 1,
    "profile": 1,
    "cost": 2,
    "search": 3,
    "plan": 3,
    "export": 4,
    "report": 4,
    "sweep": 4,
    "compat": 4,
    "validate": 4,
    "calibrate": 4,
    "api": 5,
    "": 5,
    "cli": 6,
    "__main__": 6,
}


def module_name(path: Path) -> str:
    parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def layer(module: str) -> int:
    return LAYERS[module.split(".")[1] if "." in module else ""]


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules ``source`` (the text of ``module``) imports anywhere in its body:
    ``from a import b`` counts as importing the module a.b where there is one, else a."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(_known_prefix(alias.name, known) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.add(name if name in known else _known_prefix(base, known))
    found.discard("")
    return found


def _known_prefix(name: str, known: set[str]) -> str:
    """The longest prefix of the dotted ``name`` that is a project module ('' for none)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return ""


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {
        name: imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", known) - {name}
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
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
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in on_stack:
                low[node] = min(low[node], index[target])
    return found


def test_the_reader_sees_function_level_relative_and_from_imports():
    known = {
        "nestplan",
        "nestplan.api",
        "nestplan.cost",
        "nestplan.cost.evaluator",
        "nestplan.sweep",
        "nestplan.sweep.run",
        "nestplan.sweep.spec",
        "nestplan.units",
    }
    source = (
        "import os\nfrom nestplan import units\nfrom .spec import Case\n"
        "def solve():\n    from nestplan import api\n    import nestplan.cost.evaluator as ev\n"
        "    from nestplan import __version__\n"
    )
    assert imports_of(source, "nestplan.sweep.run", False, known) == {
        "nestplan.units",
        "nestplan.sweep.spec",
        "nestplan.api",
        "nestplan.cost.evaluator",
        "nestplan",
    }


def test_cycle_finder_finds_a_cycle_and_only_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_every_module_has_a_layer():
    unknown = [name for name in all_modules() if (name.split(".")[1] if "." in name else "") not in LAYERS]
    assert not unknown, f"modules with no layer in the table (add them from docs/design.md): {unknown}"


def test_no_import_points_to_a_higher_layer():
    upward = [
        f"{src} (layer {layer(src)}) imports {dst} (layer {layer(dst)})"
        for src, targets in sorted(import_graph().items())
        for dst in sorted(targets)
        if layer(dst) > layer(src)
    ]
    assert not upward, "imports against the layering of docs/design.md:\n" + "\n".join(upward)


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "modules importing each other: " + "; ".join(" <-> ".join(c) for c in found)
