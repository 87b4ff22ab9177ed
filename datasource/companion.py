"""The JVM companion: a jar built from the package's own Java sources, and the Spark settings
that put it on a session's classpath.

What the jar holds (docs/design.md, "JVM companion"): the part decoder in the JVM
(`persistshard.companion.format`: footer, crc32c, zstd and plain segments of every format
version into Arrow vectors, column pruning, chunk skipping by statistics) with its
command-line entry `persistshard.companion.format.DecodePart`, and a table provider registered
under the short name ``persistshard`` (`persistshard.companion.CompanionProvider`): with the
jar on a session's classpath the format resolves to it. Its batch snapshot scans are
columnar, planned by Python (`persistshard.datasource.bridge`) and decoded in the JVM; every
other path (writes, streams, change reads, SQL tables) is the Python source's, delegated.

Invariants:
- The jar is built on first use with the ``javac`` of ``JAVA_HOME`` (or, without
  ``JAVA_HOME``, the one on ``PATH``), ``--release 17``, against the jars of the installed
  pyspark only: no build tool, no download, no dependency beyond what Spark ships.
- It is cached under `cache_dir` by a key of the persistshard version, the Java sources'
  digest, the pyspark version and the javac version (`cache_key`): any of them changing
  builds a new jar, none changing finds the old one.
- A build is atomic: classes and jar are made in a temporary directory inside the cache and
  renamed into place, so processes building at once each end with a complete jar, and a
  reader never sees a partial one.
- The jar's bytes are a function of the class files (entries sorted, fixed timestamps and
  modes, one compression level): two builds with the same javac give the same bytes.
- Without a JDK (no ``javac``), or when the build fails, `companion_jar` warns once per
  process (`CompanionUnavailable`) and returns None; Spark then uses the Python source,
  exactly as without the companion.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

log = logging.getLogger("persistshard.datasource.companion")

#: The package's Java sources and the jar's resources (``META-INF``), shipped in the wheel as
#: package data.
JAVA_SOURCES = Path(__file__).resolve().parent.parent / "jvm" / "src"
#: Overrides where built jars are cached (default: ``$XDG_CACHE_HOME/persistshard/companion``,
#: else ``~/.cache/persistshard/companion``).
CACHE_ENV = "PERSISTSHARD_COMPANION_CACHE"
#: The Java release the classes target: Spark 4 runs on Java 17 and later.
JAVA_RELEASE = "17"
#: The decoder's command-line entry point (`DecodePart`'s Javadoc says what it writes).
DECODE_MAIN = "persistshard.companion.format.DecodePart"
#: JVM flags Arrow's memory needs on Java 17+ (Spark's launcher passes the same).
ARROW_JVM_FLAGS = ("--add-opens=java.base/java.nio=ALL-UNNAMED",)

#: The session catalog `configure_spark` sets (``spark.sql.catalog.spark_catalog``): SQL
#: tables of persistshard with their location and options, time travel
#: (`persistshard.companion.CompanionCatalog`'s Javadoc).
SESSION_CATALOG = "persistshard.companion.CompanionCatalog"
SESSION_CATALOG_KEY = "spark.sql.catalog.spark_catalog"


def session_catalog_conf() -> str:
    """The session catalog as a ``spark-submit`` argument (``--conf key=value``)."""
    return f"--conf {SESSION_CATALOG_KEY}={SESSION_CATALOG}"


_ZIP_TIME = (2026, 1, 1, 0, 0, 0)
_MANIFEST = b"Manifest-Version: 1.0\r\nCreated-By: persistshard\r\n\r\n"
_warned = False


class CompanionUnavailable(UserWarning):
    """The companion jar could not be had (no JDK, or the build failed): Spark uses the
    Python source, with every feature, at its speed."""


def find_javac() -> str | None:
    """The ``javac`` to build with: ``$JAVA_HOME/bin/javac`` when ``JAVA_HOME`` is set (the
    JDK Spark runs on; a JRE there means no compiler), else ``javac`` on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "javac"
        return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None
    return shutil.which("javac")


@functools.lru_cache(maxsize=8)
def _javac_version(javac: str, mtime_ns: int) -> str:
    out = subprocess.run(
        [javac, "-version"], capture_output=True, text=True, check=True, timeout=120
    )
    return (out.stdout + out.stderr).strip()


def javac_version(javac: str) -> str:
    """What ``javac -version`` says (e.g. ``javac 17.0.15``); remembered per binary."""
    return _javac_version(javac, os.stat(javac).st_mtime_ns)


def pyspark_jars() -> Path | None:
    """The directory of jars the installed pyspark ships (Spark's own classpath), or None."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    jars = Path(next(iter(spec.submodule_search_locations))) / "jars"
    return jars if jars.is_dir() else None


def pyspark_version() -> str:
    """The installed pyspark's version."""
    return importlib.metadata.version("pyspark")


def source_files() -> list[Path]:
    """Every file of the companion, sorted by path (the build's input): the Java sources and
    the resources under ``META-INF`` (the data source registration), which go into the jar
    as they are."""
    return sorted(
        (p for p in JAVA_SOURCES.rglob("*") if p.is_file() and _is_source(p)),
        key=lambda p: p.relative_to(JAVA_SOURCES).as_posix(),
    )


def _is_source(path: Path) -> bool:
    rel = path.relative_to(JAVA_SOURCES)
    return path.suffix == ".java" or rel.parts[0] == "META-INF"


def source_digest() -> str:
    """sha256 over the sources' relative paths and bytes, in `source_files` order."""
    h = hashlib.sha256()
    for path in source_files():
        rel = path.relative_to(JAVA_SOURCES).as_posix().encode()
        data = path.read_bytes()
        h.update(len(rel).to_bytes(8, "little") + rel + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def cache_key(javac_text: str) -> str:
    """The jar's name in the cache: it changes exactly when the persistshard version, the
    sources, the pyspark version or the javac version (``javac -version`` text) does."""
    from persistshard import __version__

    h = hashlib.sha256()
    for part in (__version__, source_digest(), pyspark_version(), javac_text):
        h.update(part.encode() + b"\0")
    return f"persistshard-companion-{__version__}-{h.hexdigest()[:20]}.jar"


def cache_dir() -> Path:
    """Where built jars are kept (`CACHE_ENV`, else the user's cache directory)."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "persistshard" / "companion"


def write_jar(classes: Path, out: Path) -> None:
    """Write the files under ``classes`` as a jar at ``out``, reproducibly: a manifest first,
    then every file in sorted path order, each with the same timestamp, mode and deflate
    level."""
    files = sorted(
        (p for p in classes.rglob("*") if p.is_file()),
        key=lambda p: p.relative_to(classes).as_posix(),
    )
    with zipfile.ZipFile(out, "w") as jar:
        entries = [("META-INF/MANIFEST.MF", _MANIFEST)]
        entries += [(p.relative_to(classes).as_posix(), p.read_bytes()) for p in files]
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix: the mode below means the same everywhere
            info.external_attr = 0o644 << 16
            jar.writestr(info, data, compresslevel=6)


def build_jar(javac: str, jars: Path, out: Path) -> None:
    """Compile the sources with ``javac`` against ``jars`` and write the jar at ``out``
    atomically (a temporary directory next to it, then a rename). Raises
    `subprocess.CalledProcessError` (with javac's output) when javac fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent))
    try:
        classes = work / "classes"
        classes.mkdir()
        listing = work / "sources.txt"
        java = [p for p in source_files() if p.suffix == ".java"]
        listing.write_text("".join(f'"{p.as_posix()}"\n' for p in java))
        command = [
            javac,
            "--release",
            JAVA_RELEASE,
            "-nowarn",
            "-Xlint:none",
            "-encoding",
            "UTF-8",
            "-implicit:none",
            "-cp",
            str(jars / "*"),
            "-d",
            str(classes),
            f"@{listing}",
        ]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
        for resource in source_files():
            if resource.suffix != ".java":
                target = classes / resource.relative_to(JAVA_SOURCES)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(resource, target)
        staged = work / out.name
        write_jar(classes, staged)
        os.replace(staged, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _unavailable(reason: str) -> None:
    global _warned
    log.debug("persistshard companion unavailable: %s", reason)
    if not _warned:
        _warned = True
        warnings.warn(
            f"CompanionUnavailable: {reason}; Spark uses persistshard's Python source "
            "(complete, at its own speed). Install a JDK 17+ (javac) to build the companion.",
            CompanionUnavailable,
            stacklevel=3,
        )


def companion_jar() -> str | None:
    """The path of the companion jar, built on first use (module docstring), or None (and
    one `CompanionUnavailable` warning per process) without a JDK or when the build fails."""
    javac = find_javac()
    if javac is None:
        where = "JAVA_HOME/bin" if os.environ.get("JAVA_HOME") else "PATH"
        _unavailable(f"no javac found on {where} (a JRE runs Spark; the companion needs a JDK)")
        return None
    jars = pyspark_jars()
    if jars is None:
        _unavailable("the installed pyspark has no jars directory")
        return None
    try:
        out = cache_dir() / cache_key(javac_version(javac))
        if out.is_file():
            return str(out)
        log.info("building the persistshard companion jar at %s with %s", out, javac)
        build_jar(javac, jars, out)
    except subprocess.CalledProcessError as e:
        detail = (e.stderr or e.stdout or "").strip().splitlines()[-5:]
        _unavailable(f"javac failed ({e.returncode}): {' / '.join(detail)}")
        return None
    except (OSError, subprocess.SubprocessError) as e:
        _unavailable(f"the build failed: {e}")
        return None
    return str(out)


def _running_conf() -> dict[str, str] | None:
    """The configuration of the SparkContext running in this process, or None."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        return None
    return dict(sc.getConf().getAll())


def configure_spark(builder: Any) -> Any:
    """Configure a ``SparkSession.builder`` for persistshard, before the session starts, and
    return it (chainable: ``ps.configure_spark(SparkSession.builder).getOrCreate()``).

    It sets:
    - ``spark.jars``: the companion jar (`companion_jar`) appended to what the builder already
      names; without a JDK nothing (one `CompanionUnavailable` warning) and the session uses
      the Python source as always. With the jar, the format ``persistshard`` resolves to the
      companion's table provider (module docstring), which reads snapshots in the JVM and
      hands every other path to the Python source.
    - ``spark.sql.catalog.spark_catalog``: with the jar, the companion's session catalog
      (`SESSION_CATALOG`), which keeps a persistshard table's LOCATION and OPTIONS, refuses a
      table without a location, and maps ``VERSION AS OF``/``TIMESTAMP AS OF`` to the read
      option ``as_of``; every other table stays the built-in catalog's. A builder that
      already names another session catalog keeps it (a `UserWarning` says what persistshard
      tables then lack).
    - ``spark.pyspark.python`` and the environment variable ``PYSPARK_PYTHON`` (which the
      session's JVM inherits): this interpreter, for Spark's Python workers, unless the
      builder or ``PYSPARK_PYTHON`` already names one (without either, workers run
      ``python3`` from ``PATH``, which may not have persistshard: the format's lookup then
      fails).

    ``spark.jars`` and the workers' interpreter are read when a session's JVM starts: if a
    SparkContext is already running in this process and lacks either, a `UserWarning` names
    what is missing (stop the session and build it again to apply them).
    """
    options: dict[str, str] = dict(getattr(builder, "_options", {}) or {})
    jar = companion_jar()
    if jar is not None:
        named = [j for j in options.get("spark.jars", "").split(",") if j]
        if jar not in named:
            builder = builder.config("spark.jars", ",".join([*named, jar]))
        chosen = options.get(SESSION_CATALOG_KEY)
        if chosen is None:
            builder = builder.config(SESSION_CATALOG_KEY, SESSION_CATALOG)
        elif chosen != SESSION_CATALOG:
            warnings.warn(
                f"configure_spark: the builder sets {SESSION_CATALOG_KEY}={chosen}, so it is "
                f"kept; persistshard's SQL tables then lack what {SESSION_CATALOG} gives them "
                "(LOCATION and OPTIONS on every statement, time travel)",
                UserWarning,
                stacklevel=2,
            )
    running = _running_conf()
    python_named = bool(options.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON"))
    if not python_named:
        # Spark's driver-side Python workers (data source lookup, planning) read the variable
        # from the JVM's environment, which a session's JVM inherits from this process.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        builder = builder.config("spark.pyspark.python", sys.executable)
    if running is not None:
        missing = []
        if jar is not None and jar not in running.get("spark.jars", "").split(","):
            missing.append(f"spark.jars with {jar}")
        if jar is not None and SESSION_CATALOG_KEY not in running:
            missing.append(f"{SESSION_CATALOG_KEY}={SESSION_CATALOG}")
        if not python_named and not running.get("spark.pyspark.python"):
            missing.append(f"spark.pyspark.python={sys.executable}")
        if missing:
            warnings.warn(
                "configure_spark: a Spark session is already running in this process, and "
                f"it lacks {', '.join(missing)}; these settings apply only when a session "
                "starts: stop it (spark.stop()) and build the session again",
                UserWarning,
                stacklevel=2,
            )
    return builder
