"""The JVM companion prototype (``jvm/``) and the pure-Python path it would wrap.

The companion is not adopted (docs/design.md, "JVM companion: decision"), so nothing here
builds it: building needs a JDK, which the README's machine need not have, and the suite never
skips. ``jvm/check.py`` builds it and checks its behaviour in a Spark session of its own.
What these tests pin, on every machine:

- the names the Java sources hard-code still match the Python source (short name, the
  ``__`` marker option that Python's unknown-option check lets through, the service file);
- without the jar, the format name resolves to Spark's own Python provider: the fallback the
  companion must leave intact.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

JVM = Path(__file__).resolve().parent.parent / "jvm"
PROVIDER = JVM / "src/persistshard/companion/CompanionProvider.java"
SERVICE = JVM / "resources/META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"
PYTHON_PROVIDER = "org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2"


def java_constant(name: str) -> str:
    match = re.search(rf'static final String {name} = "([^"]*)";', PROVIDER.read_text())
    assert match, f"{PROVIDER.name} defines no String constant {name}"
    return match.group(1)


def test_companion_wraps_the_python_source_by_its_registered_name():
    from pyspark_persistshard import DefaultSource

    assert java_constant("PYTHON_NAME") == DefaultSource.name()


def test_companion_marker_option_passes_the_unknown_option_check():
    from persistshard.datasource.options import check_known
    from persistshard.errors import InvalidOption

    marker = java_constant("MARKER_KEY")
    check_known({marker: java_constant("MARKER_VALUE")}, frozenset(), "read")
    with pytest.raises(InvalidOption):  # the check is live: a plain unknown key is refused
        check_known({marker.lstrip("_"): "1"}, frozenset(), "read")


def test_companion_service_file_names_a_provider_class_that_exists():
    (name,) = SERVICE.read_text().split()
    assert (JVM / "src" / (name.replace(".", "/") + ".java")).is_file()


@pytest.mark.spark
def test_without_the_companion_the_format_is_sparks_python_provider(spark):
    conf = spark._jsparkSession.sessionState().conf()
    lookup = spark._jvm.org.apache.spark.sql.execution.datasources.DataSource
    assert lookup.lookupDataSource("persistshard", conf).getName() == PYTHON_PROVIDER
