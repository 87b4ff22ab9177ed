"""The suite's tiers (tests/conftest.py, README "Development"): the markers follow from what a
test starts, the fast selection leaves out every test that starts a JVM, a database, an S3
server or worker processes and the slow ones conftest names, the full command (CI's) leaves
out nothing, every marker is declared, and Hypothesis budgets follow the profile. The
collection is a child pytest (``--collect-only`` with ``-m FAST`` and a small plugin that
records each test's fixtures, markers and whether ``-m`` kept it)."""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from conformance_helpers import examples
from conftest import SLOW
from hypothesis import settings

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: The edit loop's selection, exactly as README "Development" gives it.
FAST = "not spark and not database and not s3 and not subprocess and not slow"
#: What the fast selection must never start, by the fixture that starts it.
HEAVY = {"spark": "spark_session", "database": "postgres_url"}
TIERS = ("spark", "database", "s3", "subprocess", "slow")
#: Markers pytest and its plugins define themselves.
BUILTIN = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings", "hypothesis"}

DUMP = """
import json, os
ROWS = {}
def _row(item, kept):
    return {"id": item.nodeid, "file": os.path.basename(str(item.path)), "kept": kept,
            "fixtures": list(getattr(item, "fixturenames", ())),
            "markers": sorted({m.name for m in item.iter_markers()})}
def pytest_deselected(items):
    for item in items:
        ROWS[item.nodeid] = _row(item, False)
def pytest_collection_finish(session):
    for item in session.items:
        ROWS[item.nodeid] = _row(item, True)
    with open(os.environ["TIERS_DUMP"], "w") as f:
        json.dump(list(ROWS.values()), f)
"""


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every test of the suite, as the child pytest collected it under ``-m FAST``."""
    where = tmp_path_factory.mktemp("tiers")
    (where / "tiers_dump.py").write_text(DUMP)
    dump = where / "items.json"
    env = {
        **os.environ,
        "TIERS_DUMP": str(dump),
        "PYTHONPATH": os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")]),
    }
    args = ["-p", "no:cacheprovider", "-p", "tiers_dump", "--collect-only", "-q", "-m", FAST]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *args, str(TESTS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows: list[dict[str, Any]] = json.loads(dump.read_text())
    assert len(rows) > 1000 and any(r["kept"] for r in rows) and not all(r["kept"] for r in rows)
    return rows


def _fixtures_calling(function: str) -> dict[str, set[str]]:
    """{test file: names of the fixtures defined there whose body calls ``function``}."""
    found: dict[str, set[str]] = {}
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            if not any("fixture" in ast.unparse(d) for d in node.decorator_list):
                continue
            calls = {
                ast.unparse(c.func).rsplit(".", 1)[-1]
                for c in ast.walk(node)
                if isinstance(c, ast.Call)
            }
            if function in calls:
                found.setdefault(path.name, set()).add(node.name)
    return found


def _visible(fixtures: dict[str, set[str]], file: str) -> set[str]:
    """The fixtures of ``fixtures`` a test in ``file`` can use: its own file's and
    conftest.py's."""
    return fixtures.get(file, set()) | fixtures.get("conftest.py", set())


def test_a_test_is_marked_by_what_its_fixtures_start(collected):
    """The spark fixture means ``spark``, postgres_url ``database``; every fixture in tests/
    that starts moto's server means ``s3`` for the tests of its file that use it."""
    for row in collected:
        for marker, fixture in HEAVY.items():
            if fixture in row["fixtures"]:
                assert marker in row["markers"], f"{row['id']} uses {fixture}, not {marker}"
    moto = _fixtures_calling("moto_server")
    assert {"test_s3.py", "conftest.py", "test_inline.py"} <= set(moto)
    for row in collected:
        if _visible(moto, row["file"]) & set(row["fixtures"]):
            assert "s3" in row["markers"], f"{row['id']} starts moto's server, not marked s3"


def test_the_fast_selection_starts_no_jvm_database_s3_or_workers(collected):
    """``-m FAST`` keeps only tests without a tier marker and without a heavy fixture, and
    deselects every test that has one (so the expression and the markers agree)."""
    moto = _fixtures_calling("moto_server")
    kept = [r for r in collected if r["kept"]]
    assert len(kept) > len(collected) // 2
    for row in collected:
        tiers = set(row["markers"]) & set(TIERS)
        assert row["kept"] == (not tiers), (row["id"], tiers)
    for row in kept:
        heavy = set(HEAVY.values()) | _visible(moto, row["file"])
        assert not heavy & set(row["fixtures"]), row["id"]


def _short_id(node_id: str) -> tuple[str, str]:
    """("file::function" without parameters, with them) of a node id, as `SLOW` spells them."""
    path, *rest = node_id.split("::")
    full = "::".join([os.path.basename(path), *rest])
    return full.split("[", 1)[0], full


def test_slow_names_tests_that_exist_and_the_fast_selection_leaves_them_out(collected):
    """Each entry of conftest's `SLOW` names collected tests (a renamed test would otherwise
    drop back into the fast tier unnoticed); each of them is marked ``slow`` and deselected by
    ``-m FAST``, and ``slow`` marks more than a handful of tests."""
    named: dict[str, list[dict[str, Any]]] = {entry: [] for entry in SLOW}
    for row in collected:
        for name in _short_id(row["id"]):
            if name in named:
                named[name].append(row)
    assert not [entry for entry, rows in named.items() if not rows]
    for rows in named.values():
        for row in rows:
            assert "slow" in row["markers"] and not row["kept"], row["id"]
    slow = [r for r in collected if "slow" in r["markers"]]
    assert len(slow) >= len(SLOW) >= 10


#: The README's full test command, as .ci/run runs it, in two passes. The first runs every
#: test, on two pytest-xdist workers, each file on one worker, with the session conftest
#: picks (the JVM companion in CI); the second reruns the ``python_source`` tests (the Python
#: source's read and SQL paths) without the companion, and only when the first passed.
FULL = ".venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder"
SECOND = f"PERSISTSHARD_TEST_COMPANION=0 {FULL} -m python_source"
COMMAND = f"{FULL} && {SECOND}"


def _pytest_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "-m pytest" in line]


def test_the_full_command_deselects_nothing():
    """CI runs README's full command through .ci/run: its first pass selects by neither marker
    nor keyword (nor do pytest's configured options), so every test, slow ones included, runs
    in CI; its second pass selects ``python_source`` without the companion and runs only
    when the first passed, and a failure of either (exit 5, no test collected, included)
    fails the run."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    addopts = config["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert not {"-m", "-k"} & set(addopts), addopts
    run = (ROOT / ".ci" / "run").read_text()
    first, second = _pytest_lines(run)
    assert first.startswith(FULL + " ||"), first
    assert " -m " not in first.split("pytest", 1)[1] and " -k " not in first, first
    assert second.startswith(SECOND + " ||"), second
    assert " -k " not in second, second
    lines = run.splitlines()
    guard = lines[[line.strip() for line in lines].index(second) - 1].strip()
    assert guard == 'if [ "$status" -eq 0 ]; then', guard
    assert run.index('if [ "$status" -eq 5 ]') > run.index(second)


def test_python_source_marks_the_read_and_sql_tests(collected):
    """``python_source`` marks exactly the Spark tests `conftest.WITHOUT_COMPANION` names, each
    of its patterns names collected Spark tests, and none of them starts a session of its own
    or reads a stream: the second pass reruns the Python source's read and SQL paths, and
    nothing else."""
    from conftest import WITHOUT_COMPANION

    named: dict[str, list[dict[str, Any]]] = {pattern: [] for pattern in WITHOUT_COMPANION}
    for row in collected:
        name = _short_id(row["id"])[0]
        matches = [p for p in WITHOUT_COMPANION if fnmatch.fnmatchcase(name, p)]
        for pattern in matches:
            named[pattern].append(row)
        wanted = "spark" in row["markers"] and bool(matches)
        assert ("python_source" in row["markers"]) == wanted, row["id"]
        if wanted:
            assert "subprocess" not in row["markers"], row["id"]
            assert "stream" not in name.split("::")[-1], row["id"]
    assert not [p for p, rows in named.items() if not any("spark" in r["markers"] for r in rows)]
    marked = sum("python_source" in r["markers"] for r in collected)
    spark = sum("spark" in r["markers"] for r in collected)
    assert 60 <= marked < spark // 2, (marked, spark)


def _session_header(tmp_path: Path, **env_changes: str) -> tuple[int, str]:
    """A child pytest's exit code and output when it collects nothing (``--co -k``), under
    the environment changed by ``env_changes``: its header says what the Spark session
    uses, or it failed at its start."""
    env = {**os.environ, **env_changes}
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--co",
            "-k",
            "no_test_is_named_like_this",
            str(TESTS / "test_tiers.py"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return child.returncode, child.stdout + child.stderr


def test_the_session_has_the_companion_by_default_and_says_which(tmp_path, monkeypatch):
    """The shared SparkSession has the JVM companion whenever a JDK is found, unless
    ``PERSISTSHARD_TEST_COMPANION=0`` asks for the Python source alone; the pytest header says
    which in one line. Without a JDK (a ``JAVA_HOME`` with no javac) the default falls back to
    the Python source, except under ``CI=true``, where the run fails at its start, as it does
    whenever the companion is asked for. Each choice is conftest's `_companion_session` under
    that environment; two child pytest runs check the header and the failed start."""
    import conftest
    from conftest import COMPANION_ENV

    from persistshard.datasource.companion import find_javac

    no_jdk = str(tmp_path / "no-jdk")
    os.mkdir(no_jdk)
    header = "persistshard Spark session: "
    code, out = _session_header(tmp_path, **{COMPANION_ENV: "0"})
    assert code == 5 and f"{header}the Python source alone ({COMPANION_ENV}=0)" in out, out
    assert out.count(header) == 1

    def choice(**env: str) -> tuple[bool, str]:
        with monkeypatch.context() as m:
            m.setenv("PYSPARK_SUBMIT_ARGS", "as before")
            for name, value in env.items():
                m.setenv(name, value)
            made = conftest._companion_session()
            submit = os.environ["PYSPARK_SUBMIT_ARGS"]
        assert (submit != "as before") == made[0], submit  # the jar goes to the session
        return made

    if find_javac() is not None:
        for chosen in ("", "1"):
            assert choice(**{COMPANION_ENV: chosen})[1].startswith("the JVM companion (")
    fallback = f"the Python source alone (no javac found; {COMPANION_ENV}=unset)"
    assert choice(**{COMPANION_ENV: "", "CI": "", "JAVA_HOME": no_jdk}) == (False, fallback)
    refused = [({COMPANION_ENV: "", "CI": "true"}, "CI=true")] + [
        ({COMPANION_ENV: "1", "CI": ci}, f"{COMPANION_ENV}=1") for ci in ("true", "false")
    ]
    for env, why in refused:
        with pytest.raises(RuntimeError, match=f"{why}: .*no javac was found"):
            choice(**env, JAVA_HOME=no_jdk)
    code, out = _session_header(tmp_path, **refused[0][0], JAVA_HOME=no_jdk)
    assert code not in (0, 5) and "CI=true: " in out and "no javac was found" in out, out
    assert header not in out, out


def test_every_marker_used_is_declared(collected):
    """pyproject.toml declares every marker a test carries (``--strict-markers`` refuses the
    others), and the tier markers are among them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = {m.split(":")[0].strip() for m in config["tool"]["pytest"]["ini_options"]["markers"]}
    assert "--strict-markers" in config["tool"]["pytest"]["ini_options"]["addopts"]
    used = {m for r in collected for m in r["markers"]} - BUILTIN
    assert set(TIERS) <= used <= declared, (used - declared, set(TIERS) - used)


def test_the_readme_gives_the_fast_command_beside_the_full_one():
    """README's setup command and its Development section give the full command (as .ci/run
    runs it), the fast one and the serial one."""
    readme = (ROOT / "README.md").read_text()
    development = readme.split("## Development", 1)[1]
    assert f'-m "{FAST}"' in development
    setup = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert f"&& {COMMAND}\n" in setup
    assert f"\n{COMMAND}\n" in development
    assert ".venv/bin/python -m pytest -p no:cacheprovider\n" in development  # serial


def test_no_test_fixes_its_own_example_count():
    """A bare ``max_examples=<number>`` ignores the Hypothesis profile: tests write
    ``max_examples=examples(n)`` (conformance_helpers) instead."""
    bare = [
        f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}"
        for path in sorted(TESTS.glob("*.py"))
        if path.name != "conftest.py"  # where the profiles are defined
        for text in [path.read_text()]
        for m in re.finditer(r"max_examples\s*=\s*\d", text)
    ]
    assert bare == []


def test_examples_follow_the_profile_loaded(request):
    """Under the profile loaded (tests/conftest.py: "dev" unless CI=true or
    PERSISTSHARD_HYPOTHESIS_PROFILE; pytest's --hypothesis-profile over both),
    ``examples(100)`` is the profile's own default, and the "ci" profile runs four times the
    examples of "dev"."""
    in_ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    chosen = (
        request.config.getoption("hypothesis_profile", None)
        or os.environ.get("PERSISTSHARD_HYPOTHESIS_PROFILE")
        or ("ci" if in_ci else "dev")
    )
    assert settings().max_examples == settings.get_profile(chosen).max_examples
    assert examples(100) == settings().max_examples
    assert examples(2) == 2 and examples(4) >= 3
    assert settings.get_profile("ci").max_examples == 4 * settings.get_profile("dev").max_examples


def test_the_second_pass_imports_only_the_files_it_can_select(tmp_path):
    """With ``-m python_source`` (the second pass) conftest leaves out the test files
    `WITHOUT_COMPANION` names none of, and only then: every file it names is still
    collected, and any other selection collects every file."""
    import conftest

    class Config:
        def __init__(self, markexpr: str) -> None:
            self.markexpr = markexpr

        def getoption(self, name: str, default: Any = None) -> Any:
            return self.markexpr if name == "markexpr" else default

    second, first = Config("python_source"), Config("")
    named = {pattern.split("::", 1)[0] for pattern in conftest.WITHOUT_COMPANION}
    files = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    left_out = [f for f in files if conftest.pytest_ignore_collect(tmp_path / f, second)]
    assert left_out and set(files) - set(left_out) == named, left_out
    assert not [f for f in files if conftest.pytest_ignore_collect(tmp_path / f, first)]
    assert conftest.pytest_ignore_collect(tmp_path / "conftest.py", second) is None
