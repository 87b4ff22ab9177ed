"""CI: the wheel holds exactly the package's modules, the Spark entry module, py.typed and the
JVM companion's sources (``jvm/src``: Java files and the jar's resources).

Builds the wheel from the working tree and compares its file list with what the tree says
should ship: every ``.py`` file of the packages listed in pyproject.toml, ``py.typed``, every
``.java`` file and ``META-INF`` resource under ``jvm/src``, the one top-level module
``pyspark_persistshard`` and the dist-info. Anything more (tests, benchmarks, a second copy of
the entry module) or less fails, naming the files.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def expected_files() -> set[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        setuptools_cfg = tomllib.load(f)["tool"]["setuptools"]
    package_dir = setuptools_cfg["package-dir"]
    out = {"pyspark_persistshard.py", "persistshard/py.typed"}
    for package in setuptools_cfg["packages"]:
        head, _, rest = package.partition(".")
        directory = os.path.join(ROOT, package_dir[head], *rest.split(".") if rest else [])
        for name in os.listdir(directory):
            if name.endswith(".py"):
                out.add("/".join([*package.split("."), name]))
    sources = os.path.join(ROOT, "jvm", "src")  # the JVM companion's sources and resources
    for folder, _, files in os.walk(sources):
        for name in files:
            if name.endswith(".java") or "META-INF" in folder:
                rel = os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
                out.add(f"persistshard/{rel}")
    return out


def main() -> int:
    leftovers = [os.path.join(ROOT, d) for d in ("build", "persistshard.egg-info")]
    before = {d for d in leftovers if os.path.exists(d)}
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, ROOT],
            check=True,
        )
        (wheel,) = glob.glob(os.path.join(out, "*.whl"))
        names = [n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n]
    for d in set(leftovers) - before:  # what the in-tree build left behind
        shutil.rmtree(d, ignore_errors=True)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    extra = sorted(set(names) - expected_files())
    missing = sorted(expected_files() - set(names))
    for label, files in (("duplicated", duplicates), ("unexpected", extra), ("missing", missing)):
        if files:
            print(f"wheel: {label} files: {', '.join(files)}", file=sys.stderr)
    if duplicates or extra or missing:
        return 1
    print(f"wheel: {len(names)} files, exactly the expected ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
