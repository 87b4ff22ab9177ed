"""The demo a new user runs first (``python -m persistshard.demo``, a README command): it
explains each of persistshard's terms in one sentence the first time it shows it, and leaves
no temporary directory behind."""

from __future__ import annotations

import os
import tempfile

import pytest

from persistshard import demo
from persistshard.demo import GLOSSARY


@pytest.mark.spark
@pytest.mark.slow
def test_demo_explains_its_terms_once_and_cleans_up(spark, tmp_path, monkeypatch, capsys):
    # In the session's Spark: a subprocess with a JVM of its own cost the suite a minute. Only
    # the demo's few lines that start and stop its own session are left out.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(demo, "_explained", set())
    assert demo.main([], spark=spark) == 0
    out = capsys.readouterr().out
    for term, sentence in GLOSSARY.items():
        assert out.count(sentence) == 1, f"{term} explained {out.count(sentence)} times"
    lines = out.splitlines()
    first_use = {
        "upper": next(i for i, line in enumerate(lines) if "-> upper " in line),
        "since": next(i for i, line in enumerate(lines) if "holds since" in line),
        "into-time": next(i for i, line in enumerate(lines) if line.startswith("   into-time")),
    }
    for term, at in first_use.items():
        explained = next(i for i, line in enumerate(lines) if GLOSSARY[term] in line)
        assert abs(explained - at) <= 2, f"{term} explained at line {explained}, used at {at}"
        first = min(at, explained)
        assert not any(term in line for line in lines[:first]), f"{term} used before {first}"
    assert "one transaction over invoices and payments" in out  # issue 39: a transaction
    assert "their upper is the same" in out
    assert "removed the demo's temporary directory" in out
    assert not [n for n in os.listdir(tmp_path) if n.startswith("persistshard-demo-")]
