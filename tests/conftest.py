"""Shared fixtures: one local SparkSession for the whole run (pytest-spark's ``spark_session``).

Spark's Python workers run ``$PYSPARK_PYTHON``; it is set to this interpreter before any
session starts, so workers import the same installed persistshard.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark(spark_session):
    """The session-scoped SparkSession (local[2], see ``spark_options`` in pyproject.toml)."""
    spark_session.sparkContext.setLogLevel("ERROR")
    return spark_session
