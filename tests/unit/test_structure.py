"""The package's shape, read from its source with ``ast``: sizes, import cycles and layering.

* no function longer than 100 lines, no class longer than 300 lines;
* no import cycle between shardctl's modules;
* layers depend only downward: errors → model → ids → sql → engine → ops (the router package beside ops)
  → dev → the package's public API (shardctl/__init__.py) → cli → ``python -m shardctl``
  (__main__.py). A module may import from its own layer and the layers before it, never from a
  later one.

Every import statement counts, at module level or inside a function: a deferred import is still a
dependency. Importing a module does not count as importing its parent packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "shardctl"
MAX_FUNCTION_LINES = 100
MAX_CLASS_LINES = 300

# The first part of a module name under shardctl, to its layer (lower is more basic).
LAYERS = {
    "errors": 0,
    "version": 0,
    "lazy": 0,
    "model": 1,
    "ids": 2,
    "sql": 3,
    "engine": 4,
    "ops": 5,
    "router": 5,  # the package: _async (the source), _sync (generated), placement, session, pool
    "sqlalchemy": 5,  # an ORM integration beside the Router (imports sqlalchemy: an optional extra)
    "dev": 6,
    "testing": 6,
    "django": 6,
    "": 7,  # shardctl/__init__.py: the public API
    "cli": 8,
    "__main__": 9,
}
LAYER_NAMES = {
    0: "errors",
    1: "model",
    2: "ids",
    3: "sql",
    4: "engine",
    5: "ops/router",
    6: "dev",
    7: "shardctl (API)",
    8: "cli",
    9: "__main__",
}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def where(name: str, node: ast.AST) -> str:
    return f"{MODULES[name].relative_to(PACKAGE.parent)}:{node.lineno}"


def lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def qualified(tree: ast.AST):
    """(qualified name, node) of every function and class, nested ones too."""

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, name + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def test_no_function_longer_than_100_lines():
    long = [
        f"{where(mod, node)} {name}: {lines(node)} lines"
        for mod, tree in TREES.items()
        for name, node in qualified(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and lines(node) > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions longer than {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_no_class_longer_than_300_lines():
    long = [
        f"{where(mod, node)} {name}: {lines(node)} lines"
        for mod, tree in TREES.items()
        for name, node in qualified(tree)
        if isinstance(node, ast.ClassDef) and lines(node) > MAX_CLASS_LINES
    ]
    assert not long, f"classes longer than {MAX_CLASS_LINES} lines:\n" + "\n".join(long)


def resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The shardctl modules an import statement in ``module`` depends on."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{node.module}" if node.module else package
        else:
            base = node.module or ""
        # "from package import submodule" depends on the submodule; "from module import name" on the module.
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
            for alias in node.names
        ]
    out = []
    for name in names:
        while name and name not in MODULES:  # "import shardctl.x.y" of a name inside a module
            name = name.rpartition(".")[0]
        if name.split(".")[0] == "shardctl" and name in MODULES:
            out.append(name)
    return out


def imports() -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first import}."""
    graph: dict[str, dict[str, int]] = {}
    for mod, tree in TREES.items():
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in resolve(mod, node):
                    if target != mod:
                        edges.setdefault(target, node.lineno)
        graph[mod] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    graph = imports()
    problems = []
    for component in cycles(graph):
        members = set(component)
        edges = [
            f"    {a} -> {b} ({MODULES[a].relative_to(PACKAGE.parent)}:{graph[a][b]})"
            for a in component
            for b in sorted(graph[a])
            if b in members
        ]
        problems.append(" <-> ".join(component) + "\n" + "\n".join(edges))
    assert not problems, "import cycles:\n" + "\n".join(problems)


def layer(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else ""
    assert key in LAYERS, f"{module}: a module in no layer (add it to LAYERS in this test)"
    return LAYERS[key]


def test_layers_depend_only_downward():
    upward = []
    for mod, edges in imports().items():
        for target, line in sorted(edges.items()):
            if layer(target) > layer(mod):
                upward.append(
                    f"{MODULES[mod].relative_to(PACKAGE.parent)}:{line} {mod} ({LAYER_NAMES[layer(mod)]}) "
                    f"imports {target} ({LAYER_NAMES[layer(target)]})"
                )
    assert not upward, "imports from a later layer:\n" + "\n".join(upward)


# The Router package: _async is the one source of the Routers' calls and sessions, _sync is generated
# from it (tests/support/async_to_sync.py); what both share is written once in these modules.
ROUTER_SHARED = {"shardctl.router.placement", "shardctl.router.session", "shardctl.router.pool"}
ROUTER_TWINS = {"shardctl.router._async", "shardctl.router._sync"}
# where coroutines may be written: the source, and the asyncio pool's waiting (pool.AsyncHostPool)
ROUTER_ASYNC_HOMES = {"shardctl.router._async", "shardctl.router.pool"}


def test_router_package_shape():
    """Shared Router modules import neither twin; the twins import nothing of each other (the generated
    one stands alone); callers outside the package import ``shardctl.router``, not a twin; coroutines
    are written only in the source and the asyncio pool."""
    problems = []
    for mod, edges in imports().items():
        for target, line in sorted(edges.items()):
            where_ = f"{MODULES[mod].relative_to(PACKAGE.parent)}:{line}"
            if target in ROUTER_TWINS and mod in ROUTER_SHARED | ROUTER_TWINS:
                problems.append(f"{where_} {mod} imports the twin {target}")
            elif target in ROUTER_TWINS and not mod.startswith("shardctl.router"):
                problems.append(f"{where_} {mod} imports {target}: import shardctl.router")
    for mod in MODULES:
        if mod.startswith("shardctl.router") and mod not in ROUTER_ASYNC_HOMES:
            problems += [
                f"{where(mod, node)} {mod}: a coroutine outside the Router's one source"
                for node in ast.walk(TREES[mod])
                if isinstance(node, ast.AsyncFunctionDef)
            ]
    assert not problems, "\n".join(problems)


def test_the_checks_see_what_they_check():
    """The analysis finds the modules, imports and sizes it is meant to (so the tests above can fail)."""
    assert {"shardctl.cli", "shardctl.model.dsn", "shardctl.errors", "shardctl"} <= set(MODULES)
    graph = imports()
    assert "shardctl.model.topology" in graph["shardctl.cli"]  # from ..model.topology import ...
    assert "shardctl.cli" in graph["shardctl.cli.offline"]  # from . import cli, ...
    assert "shardctl.sql.render" in graph["shardctl.cli.offline"]  # imported inside a function
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    sizes = {name: lines(node) for name, node in qualified(TREES["shardctl.cli"])}
    assert sizes["ShardctlGroup"] > sizes["ShardctlGroup.main"] > 10
