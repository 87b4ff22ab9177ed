"""What a regular install (``pip install persistshard``, no extras) brings is enough for every
path the package runs: the README's main job runs from exactly that install.

The test extra brings pandas, so the suite alone never notices a runtime requirement that only
an extra satisfies. PySpark's Arrow entry points (``mapInArrow`` and its kin) refuse to start
without pandas (``require_minimum_pandas_version``), whatever the function does; the
distributed overwrite and ``write_together`` run their tasks through ``mapInArrow``. So: find
the package's calls of those entry points (read with `ast`, nothing imported), and check that
the distributions pyproject.toml's ``dependencies`` name, followed through the installed
distributions' own requirements (extras included where asked for), reach pandas. And pip
installs the package on no Python older than the one its static checks check it against.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import os
import re
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from test_architecture import package_modules

#: PySpark calls that need pandas at run time, whatever the function given to them does.
NEEDS_PANDAS = {"mapInArrow", "mapInPandas", "applyInPandas", "applyInArrow", "toPandas"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` reach through the installed distributions' metadata:
    a requirement's extras add the requirements their markers select; a requirement whose own
    marker is false here (another Python, another platform) is not followed."""
    seen: set[str] = set()
    pending = [(Requirement(r), "") for r in requirements]
    while pending:
        req, extra = pending.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = _canonical(req.name)
        extras = sorted(req.extras)
        key = f"{name}[{','.join(extras)}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            declared = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: counted, not followed
        for text in declared:
            sub = Requirement(text)
            if sub.marker is None:
                pending.append((sub, ""))
                continue
            for wanted in ["", *extras]:
                if sub.marker.evaluate({"extra": wanted}):
                    pending.append((sub, wanted))
                    break
    return {k.split("[", 1)[0] for k in seen}


def _pyproject(repo_root: str) -> dict:
    with open(os.path.join(repo_root, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _runtime_requirements(repo_root: str) -> list[str]:
    return list(_pyproject(repo_root)["project"]["dependencies"])


def _calls(repo_root: str, names: set[str]) -> list[str]:
    """``file:line name`` of every call of an attribute in ``names`` in the shipped package's
    modules (`package_modules`)."""
    out = []
    for path in package_modules(repo_root).values():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in names
            ):
                out.append(f"{os.path.relpath(path, repo_root)}:{node.lineno} {node.func.attr}")
    return sorted(out)


def test_the_package_calls_pysparks_arrow_entry_points(repo_root):
    """The premise of the next test: without such calls it would check nothing."""
    calls = _calls(repo_root, NEEDS_PANDAS)
    assert any("overwrite.py" in c for c in calls), calls
    assert any("together.py" in c for c in calls), calls


def test_a_regular_install_brings_pandas_for_pysparks_arrow_entry_points(repo_root):
    calls = _calls(repo_root, NEEDS_PANDAS)
    reached = closure(_runtime_requirements(repo_root))
    assert "pandas" in reached, (
        f"{calls} need pandas at run time, and pyproject.toml's dependencies do not bring it "
        f"(they reach {sorted(reached)})"
    )


def test_the_closure_follows_extras_and_skips_what_a_marker_excludes():
    """`closure` itself: pyspark alone needs py4j only; its ``sql`` extra adds pandas; a
    requirement for another Python is not followed."""
    assert "pandas" not in closure(["pyspark"])
    assert {"pyspark", "py4j", "pandas", "pyarrow", "numpy"} <= closure(["pyspark[sql]"])
    assert closure(['pandas; python_version < "3"']) == set()


def test_the_oldest_python_allowed_is_the_one_mypy_and_ruff_check_against(repo_root):
    """``requires-python`` admits no Python older than the one mypy checks the package
    against (and ruff writes for): mypy knows which names each version's standard library
    has (``typing.Self``, ``datetime.UTC`` are 3.11's), so a floor below it would let pip
    install the package where its imports fail."""
    project = _pyproject(repo_root)
    checked = project["tool"]["mypy"]["python_version"]
    ruff = project["tool"]["ruff"]["target-version"]
    allowed = SpecifierSet(project["project"]["requires-python"])
    major, minor = (int(x) for x in checked.split("."))
    assert ruff == f"py{major}{minor}"
    assert f"{major}.{minor}" in allowed
    assert f"{major}.{minor - 1}" not in allowed, (
        f"requires-python {allowed} admits Python {major}.{minor - 1}, older than the "
        f"{checked} mypy checks the package against"
    )
