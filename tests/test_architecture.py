"""The module map holds: no import cycles, and imports point one way (datasource -> core -> format);
the Spark layer writes and reads through core's protocols, never a shard's internals; no module
uses another module's private names.

Read from the source with `ast` (nothing is imported), so a new cycle or a wrong-way import
fails here before it can fail somewhere subtle. docs/design.md's module map states the same
rules; this test keeps it true.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

#: Which layers a layer may import (besides itself and the leaf modules `errors` and the
#: package root's lazy exports): datasource -> core -> format, never back.
ALLOWED = {
    "format": {"format", "errors"},
    "core": {"core", "format", "errors"},
    "datasource": {"datasource", "core", "format", "errors"},
    "conformance": {"conformance", "core", "format", "errors"},
}


def package_modules(root: str) -> dict[str, str]:
    """The shipped package's modules under ``root`` (dotted name -> file): every module of
    its layers, and the root modules ``errors``, ``cli`` and ``demo``."""
    out = {}
    for layer in ("core", "format", "datasource", "conformance"):
        for folder, dirs, files in os.walk(os.path.join(root, layer)):
            dirs[:] = sorted(
                d for d in dirs if os.path.exists(os.path.join(folder, d, "__init__.py"))
            )
            package = "persistshard." + os.path.relpath(folder, root).replace(os.sep, ".")
            for name in sorted(files):
                if name.endswith(".py"):
                    mod = name[:-3]
                    dotted = package + ("" if mod == "__init__" else f".{mod}")
                    out[dotted] = os.path.join(folder, name)
    for name in ("errors", "cli", "demo"):
        out[f"persistshard.{name}"] = os.path.join(root, f"{name}.py")
    return out


def _imports(path: str, dotted: str, known: set[str]) -> set[str]:
    """The persistshard modules ``path`` imports, anywhere in it (lazy imports count: a cycle
    hidden inside a function is still a cycle)."""
    tree = ast.parse(open(path).read())
    package = dotted if path.endswith("__init__.py") else dotted.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != dotted:
                found.add(name)
    return found


def _layer(dotted: str) -> str:
    return dotted.split(".")[1]


@pytest.fixture(scope="module")
def graph(repo_root) -> dict[str, set[str]]:
    modules = package_modules(repo_root)
    known = set(modules)
    return {m: _imports(p, m, known) - {m.rpartition(".")[0]} for m, p in modules.items()}


def test_no_import_cycles(graph):
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycle = [*stack[stack.index(n) :], n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_imports_point_one_way(repo_root):
    modules = package_modules(repo_root)
    known = set(modules)
    wrong = []
    for m, path in modules.items():
        layer = _layer(m)
        if layer not in ALLOWED:
            continue
        for n in _imports(path, m, known):
            if _layer(n) not in ALLOWED[layer] and n != "persistshard":
                wrong.append(f"{m} imports {n}")
    assert not wrong, wrong


def test_core_and_format_never_import_pyspark(repo_root):
    for dotted, path in package_modules(repo_root).items():
        if _layer(dotted) not in ("core", "format"):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] == "pyspark"], dotted


def test_the_module_map_in_the_design_doc_names_every_module(repo_root):
    design = open(os.path.join(repo_root, "docs", "design.md")).read()
    section = design.split("## Module map", 1)[1].split("\n## ", 1)[0]
    missing = [
        dotted
        for dotted in package_modules(repo_root)
        if _layer(dotted) in ALLOWED
        and not dotted.endswith("__init__")
        and dotted.count(".") >= 2
        and f"`{dotted.rsplit('.', 1)[1]}`" not in section
    ]
    assert not missing, f"docs/design.md's module map does not name {missing}"


def test_every_core_subpackage_says_what_it_owns(repo_root):
    """Each room of `core` opens with a docstring that names every module in it."""
    modules = package_modules(repo_root)
    packages = [m for m, p in modules.items() if p.endswith("__init__.py") and m.count(".") == 2]
    assert len(packages) >= 5, packages
    for package in packages:
        doc = ast.get_docstring(ast.parse(open(modules[package]).read())) or ""
        inside = [m.rsplit(".", 1)[1] for m in modules if m.rpartition(".")[0] == package]
        assert doc.startswith(package), f"{package}'s docstring does not open with its name"
        unnamed = [name for name in inside if f"`{name}`" not in doc]
        assert not unnamed, f"{package}'s docstring does not name {unnamed}"


#: What a Spark path must never reach into: a shard handle's state machine and blob store
#: (public or private spelling). Writes go through `core.write.transaction` (made by
#: `core.shard.write_transaction`), reads through `core.shard`'s read helpers.
SHARD_INTERNALS = {"machine", "blob", "_machine", "_blob"}


def test_datasource_never_reaches_into_a_shards_machine_or_blob(repo_root):
    found = []
    for dotted, path in package_modules(repo_root).items():
        if _layer(dotted) != "datasource":
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Attribute) and node.attr in SHARD_INTERNALS:
                found.append(f"{dotted}:{node.lineno}: .{node.attr}")
    assert not found, found


def _python_files(root: str) -> list[str]:
    """Every Python file of the repository (the package, its tests and benchmarks)."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        out.extend(os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


#: The first names of our own modules as files import them.
OURS = ("persistshard", "benchmarks", "tests", "conftest")


def _private_uses(path: str, root: str) -> list[str]:
    """Where ``path`` imports a private name of another of our modules (``from m import
    _name``), and, outside the tests, reads one off an imported module (``m._name``). Tests
    may look at a module's private state (its caches) but never import it."""
    tree = ast.parse(open(path).read())
    shipped = os.path.relpath(path, root).split(os.sep)[0] != "tests"
    modules: set[str] = set()  # local names bound to one of our modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            ours = node.level > 0 or (node.module or "").split(".")[0] in OURS
            for alias in node.names:
                if ours and _private(alias.name):
                    found.append(f"{path}:{node.lineno}: imports {node.module}.{alias.name}")
                if ours:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    modules.add(alias.asname or alias.name.split(".")[0])
    if shipped:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
            ):
                found.append(f"{path}:{node.lineno}: uses {node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names(repo_root):
    found = [use for path in _python_files(repo_root) for use in _private_uses(path, repo_root)]
    assert not found, found


#: `persistshard.core.shard.Shard`'s public names: what README.md documents ("Python API,
#: without Spark"). Maintenance and inspection are grouped (`SHARD_GROUPS`); the flat
#: ``compact``, ``gc``, ``verify``, ``history``, ``readers`` and ``consumers`` stay because
#: the user contract names them on the shard. Plumbing (the state machine, the blob store,
#: the consensus, inline settings, handles on related shards) is private.
SHARD_SURFACE = {
    # what the handle is and how to open it again
    "location",
    "config",
    "address",
    # frontiers and columns
    "upper",
    "since",
    "schema",
    # writes
    "compare_and_append",
    "append",
    "upsert",
    "seal",
    "commit_checked",
    # history kept readable
    "advance_since",
    "set_retention",
    # reads
    "snapshot",
    "updates",
    "scan",
    "scan_updates",
    "listen",
    # reader holds and durable consumers
    "register_reader",
    "reader",
    "readers",
    "consumer",
    "consumers",
    # forks
    "fork",
    "drop",
    # the groups, and the flat names the contract promises
    "maintenance",
    "inspect",
    "compact",
    "gc",
    "verify",
    "history",
}

#: The public names of the groups: ``shard.maintenance`` and ``shard.inspect``.
SHARD_GROUPS = {
    "Maintenance": {
        "auto",
        "enabled",
        "location",
        "compact",
        "gc",
        "expire_reader",
        "drop_consumer",
    },
    "Inspect": {
        "state",
        "head_version",
        "retention",
        "readers",
        "consumers",
        "history",
        "verify",
        "describe",
    },
}


def _public_members(tree: ast.Module, name: str) -> set[str]:
    """The public names of class ``name``: its methods and properties, and the attributes
    its ``__init__`` sets on ``self``."""
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
            if node.name == "__init__":
                for sub in ast.walk(node):
                    targets = sub.targets if isinstance(sub, ast.Assign) else []
                    if isinstance(sub, ast.AnnAssign):
                        targets = [sub.target]
                    for t in targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                            if t.value.id == "self":
                                names.add(t.attr)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_shards_public_surface_is_the_documented_one(repo_root):
    """A new public member of `Shard` (or of its groups) fails here until it is documented in
    README.md and added above; plumbing belongs behind an underscore or in a module function."""
    tree = ast.parse(open(os.path.join(repo_root, "core", "shard.py")).read())
    assert _public_members(tree, "Shard") == SHARD_SURFACE
    for group, names in SHARD_GROUPS.items():
        assert _public_members(tree, group) == names, group


def test_every_public_shard_name_is_in_the_readme(repo_root):
    """Each public name of `Shard` and of its groups is documented in README.md, as
    ``shard.NAME`` or ``shard.GROUP.NAME``."""
    readme = open(os.path.join(repo_root, "README.md")).read()
    grouped = {f"{g.lower()}.{n}" for g, names in SHARD_GROUPS.items() for n in names}
    grouped.discard("maintenance.location")  # the shard's, for error messages
    missing = [
        n
        for n in sorted(SHARD_SURFACE | grouped)
        if not re.search(rf"shard\.{re.escape(n)}\b", readme)
    ]
    assert not missing, missing
